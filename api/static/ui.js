// Small shared pieces: element lookup, buttons that stay focusable when unavailable, and the
// wording of a video's status, timings and drift metrics (the live panel and the gallery agree).

export const $ = (id) => document.getElementById(id);

export const TERMINAL = new Set(["completed", "failed", "cancelled"]);

// aria-disabled rather than disabled: a disabled button drops keyboard focus to <body> when it is
// the focused one (Enter on "Generate", say), so buttons stay focusable and handlers check this.
export function setEnabled(button, on) {
  button.setAttribute("aria-disabled", String(!on));
}

export function isEnabled(button) {
  return button.getAttribute("aria-disabled") !== "true";
}

// The tiny models make small clips (64x64, 96x80, ...): show them a whole number of times larger,
// so each pixel stays a crisp square (image-rendering: pixelated in the CSS), as large as fits
// `maxWidth` (the parent's width by default) and `maxHeight`, keeping the aspect ratio.
// Media already larger than that are only shrunk to fit.
export function fitPixels(media, maxHeight, maxWidth = null) {
  media.dataset.fitHeight = maxHeight;
  if (maxWidth) media.dataset.fitWidth = maxWidth;
  media.addEventListener(media instanceof HTMLVideoElement ? "loadedmetadata" : "load", () => refit(media));
  return media;
}

// Fits `media` again (fitPixels), e.g. when the room it has changed.
export function refit(media) {
  const w = media.videoWidth ?? media.naturalWidth;
  const h = media.videoHeight ?? media.naturalHeight;
  if (!w || !h || !media.parentElement) return;
  const fit = Math.min(Number(media.dataset.fitWidth || media.parentElement.clientWidth) / w,
                       Number(media.dataset.fitHeight) / h);
  media.style.width = `${w * (fit >= 1 ? Math.floor(fit) : fit)}px`;
}

// el("p", {className: "x"}, "text", child): a tiny element builder; text goes in as text, never HTML.
export function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

const STATUS = { queued: "queued", in_progress: "in progress", completed: "completed", failed: "failed",
                 cancelled: "cancelled" };

export function statusText(video, withPercent = true) {
  let text = STATUS[video.status] ?? video.status;
  if (video.status === "queued" && video.queue_position) {
    text += `, ${placeInLine(video.queue_position, video.estimated_start_at)}`;
  }
  if (video.status === "in_progress" && withPercent) text += ` · ${video.progress}%`;
  if (video.status === "completed" && video.completed_at) text += ` in ${video.completed_at - video.created_at} s`;
  if (video.status === "failed" && video.error) text += `: ${video.error.message}`;
  return text;
}

// "next in line, starts in about 20 s": a waiting job's place, and its estimate when the server has one.
export function placeInLine(position, estimatedStartAt) {
  const place = position === 1 ? "next in line" : `number ${position} in line`;
  if (!estimatedStartAt) return place;
  const wait = Math.max(0, Math.round(estimatedStartAt - Date.now() / 1000));
  return `${place}, starts in about ${wait} s`;
}

// What a job is doing, in one line: its place in line, or its step and the time left, or how it ended.
export function progressDetail(video, now = Date.now() / 1000) {
  if (video.status === "queued") return video.queue_position ? "" : "waiting to start"; // the status says where
  if (video.status === "in_progress") {
    if (video.stage === "encoding") return `encoding the video and its renditions · ${video.progress}%`;
    const done = video.steps_done ?? 0;
    const total = video.steps_total ?? 0;
    const parts = [`generating · step ${done}/${total}`];
    const chunks = total && video.num_inference_steps ? Math.round(total / video.num_inference_steps) : 1;
    const chunk = Math.min(chunks, Math.floor(done / video.num_inference_steps) + 1);
    if (chunks > 1) parts.push(`chunk ${chunk} of ${chunks}`);
    // The steps so far at their pace: denoising is nearly all of a job.
    if (done && video.started_at) {
      parts.push(`about ${Math.max(1, Math.round(((now - video.started_at) * (total - done)) / done))} s left`);
    }
    return parts.join(" · ");
  }
  if (video.status === "completed" && video.started_at && video.completed_at) {
    const made = video.completed_at - video.started_at;
    return `made in ${made} s · ${video.size}, ${video.num_frames} frames at ${video.fps} fps`;
  }
  if (video.status === "failed" && video.error) return `error code: ${video.error.code}`;
  return "";
}

const secs = (x) => `${x < 10 ? x.toFixed(2) : x.toFixed(1)} s`;

// [label, text] pairs: time queued, each measured phase (load, denoise, decode, encode), total.
export function timings(video) {
  const rows = [];
  if (video.started_at) rows.push(["queued", `${video.started_at - video.created_at} s`]);
  for (const [phase, value] of Object.entries(video.timings ?? {})) {
    if (typeof value === "number") rows.push([phase, secs(value)]);
  }
  if (video.completed_at) rows.push(["total", `${video.completed_at - video.created_at} s`]);
  return rows;
}

// One chunk's drift against the first chunk: brightness change, sharpness ratio, histogram distance.
export function drift(d) {
  if (!d) return "no drift metrics";
  const parts = [];
  if (typeof d.luma_change === "number") {
    parts.push(`luma ${d.luma_change >= 0 ? "+" : "−"}${Math.abs(d.luma_change * 100).toFixed(1)}%`);
  }
  if (typeof d.sharpness_ratio === "number") parts.push(`sharpness ×${d.sharpness_ratio.toFixed(2)}`);
  if (typeof d.histogram_distance === "number") parts.push(`histogram ${d.histogram_distance.toFixed(3)}`);
  return parts.join(" · ") || "no drift metrics";
}

// The gallery's one line: how many chunks, and the last one's drift (drift grows along a chain).
export function driftSummary(chunks) {
  if (!chunks?.length) return "—";
  const last = chunks.reduce((a, b) => (b.index > a.index ? b : a));
  return chunks.length === 1 ? `1 chunk: ${drift(last.drift)}` : `${chunks.length} chunks; last: ${drift(last.drift)}`;
}
