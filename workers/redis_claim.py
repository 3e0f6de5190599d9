"""The Celery lane's claim: one Lua script that picks the next job by the fair-share policy
(`workers/fair_share.py`, which it mirrors line for line), takes it off the schedule and
charges its key, atomically, so API processes and workers on any machine agree on the order
and no job is handed to two workers.

A scan of the lane's waiting jobs, not a structure per key: aging and the keys' standings
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
local function standing(key)
    return math.max(tonumber(redis.call('HGET', KEYS[5], key) or '0'), clock)
end
local function before(a, b)
    if a.rank ~= b.rank then return a.rank < b.rank end
    if a.at ~= b.at then return a.at < b.at end
    return a.id < b.id
end
local function add(candidates, zset, found)
    for i = 1, #found, 2 do
        candidates[#candidates + 1] = {id = found[i], at = tonumber(found[i + 1]), zset = zset}
    end
end
while true do
    -- The highest effective level: a level's jobs, and the jobs one below that waited past aging.
    local candidates = {}
    for level = 3, 1, -1 do
        add(candidates, KEYS[level], redis.call('ZRANGE', KEYS[level], 0, -1, 'WITHSCORES'))
        if level > 1 then
            local aged = string.format('%.17g', now - aging)
            add(candidates, KEYS[level - 1], redis.call('ZRANGEBYSCORE', KEYS[level - 1], '-inf', aged, 'WITHSCORES'))
        end
        if #candidates > 0 then break end
    end
    if #candidates == 0 then return nil end
    local retrying = false
    for _, c in ipairs(candidates) do
        local entry = cjson.decode(redis.call('HGET', KEYS[4], c.id))
        c.key, c.share, c.retry = entry.key, entry.share, entry.retry
        retrying = retrying or c.retry
    end
    -- A job given back goes first, oldest first; else the least served key's oldest job.
    local chosen = nil
    for _, c in ipairs(candidates) do
        if not retrying or c.retry then
            c.rank = retrying and 0 or standing(c.key)
            if chosen == nil or before(c, chosen) then chosen = c end
        end
    end
    redis.call('ZREM', chosen.zset, chosen.id)
    redis.call('HDEL', KEYS[4], chosen.id)
    if redis.call('SISMEMBER', KEYS[7], chosen.id) == 1 then
        local base = standing(chosen.key)
        redis.call('SET', KEYS[6], string.format('%.17g', base))
        redis.call('HSET', KEYS[5], chosen.key, string.format('%.17g', base + 1 / chosen.share))
        return chosen.id
    end
end
"""
