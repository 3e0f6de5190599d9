// The result panel: the job on screen (made here, or shown from the gallery), followed through its
// event stream (status, steps, place in line, chunks and what looks wrong in them), its video playing
// as it is made and once done; then its downloads, what can be made from it (remix, extend, the same
// seed again), and the request that made it, to copy as curl or Python.
import * as api from "./api.js";
import * as form from "./form.js";
import * as player from "./player.js";
import { curl, path, python } from "./snippet.js";
import { StreamPlayer, followPlaylist } from "./stream.js";
import { $, TERMINAL, drift, el, fitPixels, isEnabled, progressDetail, refit, setEnabled, statusText,
         timings } from "./ui.js";

const error = $("job-error");
// The requests this page sent, by the id of the video each made: what the snippet shows.
const requests = new Map();
// The job on screen: {id, video, controller, urls, chunks, status, position, warnings, cancelling, stream}
let live = null;
let busy = false;
let statusChanged = () => {};

export function setup(callbacks) {
  statusChanged = callbacks.statusChanged;
  const screen = $("live-video");
  fitPixels(screen, 480); // as wide as the panel, at most 480 px high
  new ResizeObserver(() => refit(screen)).observe(screen.parentElement);
  player.setup(screen);
  form.setup({ submit });
  $("cancel").addEventListener("click", async () => {
    if (!live || !isEnabled($("cancel"))) return;
    try {
      await cancel(live.id);
    } catch (err) {
      api.showError($("live-error"), err);
    }
  });
  $("remix").addEventListener("click", () => makeFrom("remix"));
  $("extend").addEventListener("click", () => makeFrom("extend"));
  $("rerun").addEventListener("click", () => makeFrom("rerun"));
  $("to-result").addEventListener("click", (event) => {
    event.preventDefault();
    $("remix").focus(); // scrolls it into view: on a narrow page it is far above the form
  });
  $("copy-curl").addEventListener("click", () => copy($("snippet-curl").textContent, "curl command"));
  $("copy-python").addEventListener("click", () => copy($("snippet-python").textContent, "Python code"));
}

async function submit() {
  if (busy) return;
  api.showError(error, null);
  form.clearInvalid();
  // Always multipart (the image may ride along): every field is text there, nested ones JSON text.
  const { fields, image } = form.formFields();
  const body = new FormData();
  for (const [name, value] of Object.entries(fields)) {
    body.set(name, typeof value === "string" ? value : JSON.stringify(value));
  }
  if (image) body.set("input_reference", image);
  const request = { kind: "create", fields, image };
  if (await send("v1/videos", { method: "POST", body }, request, error, (err) => form.pointAt(err, error))) {
    // The result is at the top of the page: on a narrow one, far above the form. Bring it into view
    // (focus stays in the form, for the next one).
    const screen = $("live-video").parentElement;
    const top = screen.getBoundingClientRect().top;
    if (top < 0 || top > window.innerHeight / 3) screen.scrollIntoView({ block: "start" });
  }
}

// A new video from the one on screen: a remix (its settings with the form's prompt), an extension
// (continued by the form's seconds, or one chunk), or the same request again.
function makeFrom(action) {
  const video = live?.video;
  if (!video || busy) return;
  const typed = form.formFields().fields;
  const prompt = typed.prompt.trim() ? typed.prompt : video.prompt;
  const request = action === "rerun" ? { kind: "remix", source: video.id, fields: { prompt: video.prompt } }
    : action === "remix" ? { kind: "remix", source: video.id, fields: { prompt } }
      : { kind: "extend", fields: { prompt, seconds: typed.seconds ?? String(form.chunkSeconds(video.model)),
                                    video: { id: video.id } } };
  api.showError($("live-error"), null);
  send(`v1/${path(request)}`, { method: "POST", json: request.fields }, request, $("live-error"))
    .then((made) => made && $("live-h").focus()); // the buttons hide while the new video is made
}

// Sends a request that makes a video and follows the video; whether it was made.
async function send(url, options, request, region, onError = () => {}) {
  busy = true;
  $("job-form").setAttribute("aria-busy", "true");
  try {
    follow(await api.getJSON(url, options), request);
    return true;
  } catch (err) {
    api.showError(region, err);
    onError(err);
    return false;
  } finally {
    busy = false;
    $("job-form").removeAttribute("aria-busy");
  }
}

// Shows a video in the panel (from the gallery), following it if it is still running.
// Focus moves to the panel's heading, so a keyboard user carries on from there (Tab: Cancel).
export function show(video) {
  follow(video);
  $("live-h").focus();
}

export async function cancel(id) {
  const video = await api.getJSON(`v1/videos/${id}/cancel`, { method: "POST" });
  if (live?.id === id) {
    live.cancelling = true;
    render(video);
    // A running job stops at its next denoising step; the event stream reports when it has.
    if (video.status === "in_progress") $("live-status").textContent = "cancelling: stops at the next step";
  }
  return video;
}

function follow(video, request = null) {
  if (request) requests.set(video.id, request);
  if (live) {
    live.controller.abort();
    live.stream?.close();
    for (const url of live.urls) URL.revokeObjectURL(url);
  }
  live = { id: video.id, video, controller: new AbortController(), urls: [], chunks: new Set(), status: null,
           position: null, warnings: null, cancelling: false, stream: null };
  $("stage-empty").hidden = true;
  $("live").hidden = false;
  $("live-id").textContent = video.id;
  $("live-chunks").replaceChildren();
  $("live-downloads").replaceChildren();
  showResult(false);
  emptyPlayer();
  api.showError($("live-error"), null);
  showSnippet(video);
  render(video);
  if (!TERMINAL.has(video.status)) stream(live, video);
  watch(live, video);
}

// What can be done with a completed video, and the form's link to it (from the prompt: one Tab).
function showResult(on) {
  $("result").hidden = !on;
  $("to-result").hidden = !on;
}

function emptyPlayer() {
  const screen = $("live-video");
  screen.hidden = true;
  screen.removeAttribute("src");
  screen.load();
  player.reset();
}

// Plays the job's HLS stream while it runs; the player shows once the first chunk is in it.
function stream(job, video) {
  const screen = $("live-video");
  job.stream = new StreamPlayer(screen);
  screen.setAttribute("aria-label", `Video ${job.id}, as it is made`);
  screen.addEventListener("loadedmetadata", () => { screen.hidden = false; }, { once: true });
  followPlaylist(job.stream, video.stream_url, job.controller.signal).catch((err) => {
    if (err.name !== "AbortError" && !job.stream.closed) api.showError($("live-error"), err);
  });
}

async function watch(job, video) {
  // The stream replays the current status and every finished chunk on connect, so after a
  // dropped connection it is simply opened again; chunks are de-duplicated by index.
  let failures = 0;
  while (live === job && !TERMINAL.has(video.status)) {
    try {
      const response = await api.request(`v1/videos/${job.id}/events`, { signal: job.controller.signal });
      for await (const { event, data } of api.events(response)) {
        if (live !== job) return;
        if (event === "video.chunk") addChunk(job, data.index, data.frames, data.drift);
        else if (event === "video.progress") {
          video = { ...video, ...data }; // what moved; the rest is the last status event's object
          render(video);
        } else if (event === "video.deleted") {
          $("live-status").textContent = "deleted";
          return;
        } else if (data.object === "video") {
          video = data;
          render(video);
        }
      }
    } catch (err) {
      if (err.name === "AbortError" || live !== job) return;
      api.showError($("live-error"), err);
      if (err.status !== 0 || ++failures > 5) return; // the API said no: retrying will not help
    }
    if (!TERMINAL.has(video.status)) await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  if (live === job && video.status === "completed") {
    showDownloads(video);
    showResult(true);
    try {
      const url = await api.blobURL(`v1/videos/${job.id}/content?variant=video`, { signal: job.controller.signal });
      if (live !== job) return URL.revokeObjectURL(url);
      job.urls.push(url);
      const screen = $("live-video");
      screen.src = url;
      screen.setAttribute("aria-label", `Video ${job.id}`);
      screen.hidden = false;
      screen.play().catch(() => {}); // muted, so allowed; a new source may interrupt it
    } catch (err) {
      if (err.name !== "AbortError") api.showError($("live-error"), err);
    }
  }
}

function render(video) {
  if (live?.id !== video.id) return;
  live.video = video;
  $("live").dataset.status = video.status;
  const progress = $("live-progress");
  progress.value = video.progress ?? 0;
  $("live-percent").textContent = `${progress.value}%`;
  $("live-prompt").textContent = video.prompt ?? "";
  $("live-detail").textContent = progressDetail(video);
  $("screen-note").textContent = SCREEN_NOTES[video.status] ?? "";
  progress.parentElement.hidden = TERMINAL.has(video.status); // done: the status says how it ended
  // The live region speaks on status changes and moves in line only, not on every step.
  if (video.status !== live.status || video.queue_position !== live.position) {
    live.status = video.status;
    live.position = video.queue_position;
    $("live-status").textContent = statusText(video, false);
    // The stream makes way for the downloadable video (watch) at once: a completed job's player
    // only ever plays what its download link holds.
    if (video.status === "completed" && live.stream) {
      live.stream.close();
      emptyPlayer();
    }
    statusChanged(video);
  }
  setEnabled($("cancel"), !TERMINAL.has(video.status) && !live.cancelling);
  $("live-timings").replaceChildren(...timings(video).flatMap(([name, text]) => [el("dt", {}, name),
                                                                                  el("dd", {}, text)]));
  for (const chunk of video.chunks ?? []) addChunk(live, chunk.index, chunk.frames, chunk.drift);
  const warnings = JSON.stringify(video.warnings ?? []);
  if (warnings !== live.warnings) { // they come with a chunk, or with the completed status
    live.warnings = warnings;
    showWarnings(video.warnings ?? []);
  }
}

// What the dark screen says while it has no picture to show.
const SCREEN_NOTES = { queued: "Waiting for its turn…", in_progress: "It plays here once its first chunk is made…",
                       completed: "Loading the video…", failed: "No video: the job failed.",
                       cancelled: "No video: cancelled before a chunk was made." };

// What looks wrong (blank, one flat colour, frozen) is said beside the player, and on the chunk it is in.
function showWarnings(warnings) {
  const region = $("live-warnings");
  region.replaceChildren(...warnings.map((w) => el("p", {}, el("strong", {}, "Warning: "), w.message)));
  region.hidden = !warnings.length;
  flagChunks(warnings);
}

function flagChunks(warnings) {
  for (const item of $("live-chunks").children) {
    item.querySelector("p.warning")?.remove();
    const found = warnings.filter((w) => w.chunk === Number(item.dataset.index));
    if (found.length) item.append(el("p", { className: "warning" }, `⚠ ${found.map((w) => w.code).join(", ")}`));
  }
}

function addChunk(job, index, frames, metrics) {
  if (job.chunks.has(index)) return;
  job.chunks.add(index);
  // preload "auto": the blob is in memory already, and the first frame then shows at once. No native
  // controls over a small clip: a click, Enter or Space plays or pauses it.
  const chunkPlayer = fitPixels(el("video", { muted: true, loop: true, playsInline: true, preload: "auto",
                                              tabIndex: 0 }), 192);
  chunkPlayer.setAttribute("aria-label", `Chunk ${index + 1} (Enter plays or pauses it)`);
  const playOrPause = () => (chunkPlayer.paused ? chunkPlayer.play().catch(() => {}) : chunkPlayer.pause());
  chunkPlayer.addEventListener("click", playOrPause);
  chunkPlayer.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" && event.key !== " ") return;
    event.preventDefault();
    playOrPause();
  });
  const caption = el("p", {}, `Chunk ${index + 1}: ${frames} frames; ${drift(metrics)}`);
  const item = el("li", {}, caption, chunkPlayer);
  item.dataset.index = index;
  // Chunks may be announced out of order after a reconnect: keep the list sorted.
  const next = [...$("live-chunks").children].find((li) => Number(li.dataset.index) > index);
  $("live-chunks").insertBefore(item, next ?? null);
  flagChunks(job.video.warnings ?? []);
  api.blobURL(`v1/videos/${job.id}/content?variant=chunk&index=${index}`, { signal: job.controller.signal })
    .then((url) => {
      if (live !== job) return URL.revokeObjectURL(url);
      job.urls.push(url);
      chunkPlayer.src = url;
    })
    .catch((err) => {
      if (err.name !== "AbortError") caption.append(` (not downloadable: ${api.describe(err)})`);
    });
}

const FORMATS = { mp4: "MP4", webm: "WebM", mov: "MOV", gif: "GIF", apng: "APNG", frames: "PNG frames (ZIP)" };

// A rendition's link text: its format, and what sets it apart (its own name, codec, frame rate).
function renditionLabel(output, video) {
  const label = [FORMATS[output.format] ?? output.format];
  if (output.name !== output.format) label.push(`“${output.name}”`);
  if (output.codec && output.name !== output.format) label.push(output.codec);
  if (output.fps !== video.fps) label.push(`${output.fps} fps`);
  return label.join(" ");
}

// Every file of a completed video: the MP4, the thumbnail, the spritesheet, each rendition.
function showDownloads(video) {
  const files = [["video", "MP4", `${video.id}.mp4`], ["thumbnail", "Thumbnail (WebP)", `${video.id}.webp`],
                 ["spritesheet", "Spritesheet (JPEG)", `${video.id}-spritesheet.jpg`],
                 ...(video.outputs ?? []).map((o) => [o.name, renditionLabel(o, video),
                                                      `${video.id}-${o.filename ?? o.name}`, o.bytes])];
  $("live-downloads").replaceChildren(...files.map(([variant, label, filename, bytes]) => {
    const link = el("a", { href: `v1/videos/${video.id}/content?variant=${encodeURIComponent(variant)}`,
                           download: filename }, label);
    if (variant === "video") link.id = "live-download";
    if (bytes) link.append(" ", el("small", {}, `${Math.max(1, Math.round(bytes / 1024))} KB`));
    link.addEventListener("click", (event) => downloadWithKey(event, link));
    return el("li", {}, link);
  }));
}

// A link cannot send the API key: with one, the file is fetched with it and saved from memory.
async function downloadWithKey(event, link) {
  if (!api.getKey()) return; // the browser follows the link itself
  event.preventDefault();
  try {
    const url = await api.blobURL(link.getAttribute("href"));
    const save = el("a", { href: url, download: link.download });
    document.body.append(save);
    save.click();
    save.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (err) {
    api.showError($("live-error"), err);
  }
}

// The request that made the video, when this page sent it; otherwise a remix with its own prompt,
// which makes it again (the same settings, seed, first frame and source).
function showSnippet(video) {
  const sent = requests.get(video.id);
  const request = sent ?? { kind: "remix", source: video.id, fields: { prompt: video.prompt } };
  const base = new URL("v1/", document.baseURI).href;
  const keyed = Boolean(api.getKey());
  $("snippet-curl").textContent = curl(request, base, keyed);
  $("snippet-python").textContent = python(request, base);
  $("snippet-note").textContent = (sent ? "The request this page sent for this video." : "Made elsewhere: this " +
    "remix with its own prompt makes it again.") + (keyed ? " Set VIDSERVE_API_KEY to your key first." : "") +
    (request.image ? ` Run it beside ${request.image.name}.` : "");
  $("copy-status").textContent = "";
}

async function copy(text, what) {
  try {
    await navigator.clipboard.writeText(text);
    $("copy-status").textContent = `Copied the ${what}.`;
  } catch {
    $("copy-status").textContent = `Could not copy (the browser refused): select the ${what} above instead.`;
  }
}
