// The video form and the live job: submit, follow the event stream (progress, chunks as they
// finish, the terminal status), play the video as it is made, then the result, cancel.
import * as api from "./api.js";
import { StreamPlayer, followPlaylist } from "./stream.js";
import { $, TERMINAL, drift, el, fitPixels, isEnabled, setEnabled, statusText, timings } from "./ui.js";

const form = $("job-form");
const error = $("job-error");
const KINDS = { t2v: "text-to-video", i2v: "image-to-video", ti2v: "text/image-to-video" };
const models = new Map();
// The job shown in the live panel: {id, controller, urls, chunks, status, position, cancelling, stream}
let live = null;
let busy = false;
let statusChanged = () => {};

export function setup(callbacks) {
  statusChanged = callbacks.statusChanged;
  fitPixels($("live-video"), 480); // as wide as the panel, at most 480 px high
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  // Enter in a textarea is a newline, so the prompt submits on Ctrl/Cmd+Enter.
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  $("model").addEventListener("change", describeModel);
  $("cancel").addEventListener("click", async () => {
    if (!live || !isEnabled($("cancel"))) return;
    try {
      await cancel(live.id);
    } catch (err) {
      api.showError($("live-error"), err);
    }
  });
}

export function setModels(list) {
  const select = $("model");
  const chosen = select.value;
  models.clear();
  select.replaceChildren(new Option("server default", ""));
  for (const model of list) {
    models.set(model.id, model);
    select.add(new Option(`${model.id} (${model.kind})${model.unavailable ? " — unavailable" : ""}`, model.id));
  }
  select.value = models.has(chosen) ? chosen : "";
  describeModel();
}

// The adapters the server may apply; the form sends the chosen one (if any) at its scale.
export function setLoras(list) {
  const select = $("lora");
  const chosen = select.value;
  select.replaceChildren(new Option("none", ""));
  for (const lora of list) {
    const fits = lora.base_models.length ? ` (for ${lora.base_models.join(", ")})` : "";
    select.add(new Option(`${lora.id}${fits}`, lora.id));
  }
  select.value = list.some((lora) => lora.id === chosen) ? chosen : "";
}

function describeModel() {
  const model = models.get($("model").value);
  $("size").placeholder = model ? model.size : "WxH";
  $("model-hint").textContent = model
    ? `${KINDS[model.kind] ?? model.kind}, native ${model.size} at ${model.fps} fps, ${model.frames_per_chunk} frames ` +
      `per chunk${model.kind === "i2v" ? "; needs a first-frame image" : ""}.` +
      (model.unavailable ? ` Unavailable: ${model.unavailable}.` : "")
    : "The server's default model, at its native size.";
}

// The form's fields as the API names them, for POST /v1/videos and a live session alike. Empty
// fields are left out so the server's defaults apply; numbers stay the text typed (the API reads
// "7" as 7, and a long seed keeps every digit). The prompt always goes: an empty one is the API's
// to reject. The first-frame image is apart: `image`, a File or undefined.
export function formFields() {
  const fields = { prompt: form.elements.prompt.value };
  for (const name of ["model", "size", "seconds", "seed", "num_inference_steps"]) {
    const value = form.elements[name].value.trim();
    if (value) fields[name] = value;
  }
  const mode = form.elements.attention.value;
  const density = form.elements.density.value;
  if (mode) fields.attention = { mode, ...(mode === "sparse" && density ? { density: Number(density) } : {}) };
  const lora = form.elements.lora.value;
  if (lora) {
    const scale = form.elements.lora_scale.value;
    fields.loras = [{ name: lora, ...(scale ? { scale: Number(scale) } : {}) }];
  }
  return { fields, image: form.elements.input_reference.files[0] };
}

// Marks the field an API error names, so the fix is one keystroke away.
export function pointAt(err) {
  const field = err.param && form.elements[err.param.split(".")[0]];
  if (field instanceof HTMLElement) {
    field.setAttribute("aria-invalid", "true");
    field.focus();
  }
}

async function submit() {
  if (busy) return;
  api.showError(error, null);
  for (const field of form.querySelectorAll("[aria-invalid]")) field.removeAttribute("aria-invalid");
  // Always multipart (the image may ride along): every field is text there, nested ones JSON text.
  const { fields, image } = formFields();
  const body = new FormData();
  for (const [name, value] of Object.entries(fields)) {
    body.set(name, typeof value === "string" ? value : JSON.stringify(value));
  }
  if (image) body.set("input_reference", image);

  busy = true;
  form.setAttribute("aria-busy", "true");
  try {
    const video = await api.getJSON("v1/videos", { method: "POST", body });
    follow(video);
  } catch (err) {
    api.showError(error, err);
    pointAt(err);
  } finally {
    busy = false;
    form.removeAttribute("aria-busy");
  }
}

// Shows a video in the live panel (from the gallery), following it if it is still running.
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

function follow(video) {
  if (live) {
    live.controller.abort();
    live.stream?.close();
    for (const url of live.urls) URL.revokeObjectURL(url);
  }
  live = { id: video.id, controller: new AbortController(), urls: [], chunks: new Set(), status: null, position: null,
           stream: null };
  $("live").hidden = false;
  $("live-id").textContent = video.id;
  $("live-chunks").replaceChildren();
  emptyPlayer();
  $("live-download").hidden = true;
  api.showError($("live-error"), null);
  render(video);
  if (!TERMINAL.has(video.status)) stream(live, video);
  watch(live, video);
}

function emptyPlayer() {
  const player = $("live-video");
  player.hidden = true;
  player.removeAttribute("src");
  player.load();
}

// Plays the job's HLS stream while it runs; the player shows once the first chunk is in it.
function stream(job, video) {
  const player = $("live-video");
  job.stream = new StreamPlayer(player);
  player.setAttribute("aria-label", `Video ${job.id}, as it is made`);
  player.addEventListener("loadedmetadata", () => { player.hidden = false; }, { once: true });
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
        else if (event === "video.deleted") {
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
    try {
      const url = await api.blobURL(`v1/videos/${job.id}/content?variant=video`, { signal: job.controller.signal });
      if (live !== job) return URL.revokeObjectURL(url);
      job.urls.push(url);
      const player = $("live-video");
      player.src = url;
      player.setAttribute("aria-label", `Video ${job.id}`);
      player.hidden = false;
      const link = $("live-download");
      link.href = url;
      link.download = `${job.id}.mp4`;
      link.hidden = false;
    } catch (err) {
      if (err.name !== "AbortError") api.showError($("live-error"), err);
    }
  }
}

function render(video) {
  if (live?.id !== video.id) return;
  const progress = $("live-progress");
  progress.value = video.progress ?? 0;
  $("live-percent").textContent = `${progress.value}%`;
  $("live-prompt").textContent = video.prompt ?? "";
  // The live region speaks on status changes and moves in line only, not on every percent.
  if (video.status !== live.status || video.queue_position !== live.position) {
    live.status = video.status;
    live.position = video.queue_position;
    $("live-status").textContent = statusText(video, false);
    showWarnings(video.warnings ?? []); // they come with the completed status, so change only with it
    // The stream makes way for the downloadable video (watch) at once: a completed job's player
    // only ever plays what its download link holds.
    if (video.status === "completed" && live.stream) {
      live.stream.close();
      emptyPlayer();
    }
    statusChanged(video);
  }
  setEnabled($("cancel"), !TERMINAL.has(video.status) && !live.cancelling);
  $("live-timings").replaceChildren(...timings(video).flatMap(([name, text]) => [el("dt", {}, name), el("dd", {}, text)]));
  for (const chunk of video.chunks ?? []) addChunk(live, chunk.index, chunk.frames, chunk.drift);
}

// A completed video that looks wrong (blank, one flat colour, frozen) says so beside the player.
function showWarnings(warnings) {
  const region = $("live-warnings");
  region.replaceChildren(...warnings.map((w) => el("p", {}, el("strong", {}, "Warning: "), w.message)));
  region.hidden = !warnings.length;
}

function addChunk(job, index, frames, metrics) {
  if (job.chunks.has(index)) return;
  job.chunks.add(index);
  // preload "auto": the blob is in memory already, and the first frame then shows at once.
  const player = fitPixels(el("video", { controls: true, muted: true, loop: true, playsInline: true, preload: "auto" }), 192);
  player.setAttribute("aria-label", `Chunk ${index + 1}`);
  const caption = el("p", {}, `Chunk ${index + 1}: ${frames} frames; ${drift(metrics)}`);
  const item = el("li", {}, caption, player);
  item.dataset.index = index;
  // Chunks may be announced out of order after a reconnect: keep the list sorted.
  const next = [...$("live-chunks").children].find((li) => Number(li.dataset.index) > index);
  $("live-chunks").insertBefore(item, next ?? null);
  api.blobURL(`v1/videos/${job.id}/content?variant=chunk&index=${index}`, { signal: job.controller.signal })
    .then((url) => {
      if (live !== job) return URL.revokeObjectURL(url);
      job.urls.push(url);
      player.src = url;
    })
    .catch((err) => {
      if (err.name !== "AbortError") caption.append(` (not downloadable: ${api.describe(err)})`);
    });
}
