"""The Celery lane's claim: one Lua script that picks the next job by the fair-share policy
(`workers/fair_share.py`, which it mirrors line for line), takes it off the schedule and
charges its key, atomically, so API processes and workers on any machine agree on the order
and no job is handed to two workers.

A scan of the lane's waiting jobs, not a structure per key: aging and the keys' counts
change the choice with every claim, the lane holds at most `max_queued` jobs, and one pass
over them is less to get wrong than keeping per-key heads in step with every add and claim.

KEYS: 1-3 the lane's waiting ids at each level (low, normal, high), scored by creation;
4 the entries (id -> {"key", "share", "retry"}); 5 starts per key; 6 the lane's clock;
7 the job store's set of queued ids. ARGV: now, aging seconds.
Returns the claimed id, or nil when nothing waits. An id whose job is no longer queued
(cancelled, deleted, or started after being scheduled twice) is dropped, and the next tried.
"""

CLAIM_NEXT = """
local now, aging = tonumber(ARGV[1]), tonumber(ARGV[2])
local clock = tonumber(redis.call('GET', KEYS[6]) or '0')
local served, flat = {}, redis.call('HGETALL', KEYS[5])
for i = 1, #flat, 2 do served[flat[i]] = tonumber(flat[i + 1]) end
local function count(key)
    return math.max(served[key] or 0, clock)
end
-- fair_share.next_entry: a job given back first, oldest first; else the least served key,
-- then the highest effective level, then the oldest.
local function before(a, b)
    if a.retry ~= b.retry then return a.retry end
    if not a.retry then
        if a.count ~= b.count then return a.count < b.count end
        if a.level ~= b.level then return a.level > b.level end
    end
    if a.at ~= b.at then return a.at < b.at end
    return a.id < b.id
end
local entries, waiting = {}, {}
flat = redis.call('HGETALL', KEYS[4])
for i = 1, #flat, 2 do entries[flat[i]] = cjson.decode(flat[i + 1]) end
for level = 1, 3 do
    local found = redis.call('ZRANGE', KEYS[level], 0, -1, 'WITHSCORES')
    for i = 1, #found, 2 do
        local id, at = found[i], tonumber(found[i + 1])
        local entry = entries[id]
        -- fair_share.effective_level: one level higher once it has waited `aging` (levels 0-2 here are 1-3).
        local effective = (at <= now - aging) and math.min(level + 1, 3) or level
        waiting[#waiting + 1] = {id = id, at = at, zset = KEYS[level], key = entry.key, share = entry.share,
                                 retry = entry.retry, level = effective, count = count(entry.key)}
    end
end
while #waiting > 0 do
    local chosen, index = nil, nil
    for i, w in ipairs(waiting) do
        if chosen == nil or before(w, chosen) then chosen, index = w, i end
    end
    table.remove(waiting, index)
    redis.call('ZREM', chosen.zset, chosen.id)
    redis.call('HDEL', KEYS[4], chosen.id)
    if redis.call('SISMEMBER', KEYS[7], chosen.id) == 1 then
        if not chosen.retry then  -- a job given back was charged when it first started
            redis.call('SET', KEYS[6], string.format('%.17g', chosen.count))
            redis.call('HSET', KEYS[5], chosen.key, string.format('%.17g', chosen.count + 1 / chosen.share))
        end
        return chosen.id
    end
end
return nil
"""
