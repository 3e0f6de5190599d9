// The video form: every field a request takes from a person (the rest keep the server's defaults),
// the models and their presets, the adapters, example prompts, and the API's errors pointed at the
// field they name. A live session (realtime.js) sends the same fields.
import { showError } from "./api.js";
import { $ } from "./ui.js";

const form = $("job-form");
const KINDS = { t2v: "text-to-video", i2v: "image-to-video", ti2v: "text/image-to-video" };
// Sent as typed when not empty (numbers too: the API reads "7" as 7, and a long seed keeps every digit).
const TEXT_FIELDS = ["model", "size", "seconds", "seed", "num_inference_steps", "guidance_scale", "preset",
                     "negative_prompt", "drift_correction", "priority"];
const models = new Map();
let defaultModel = null;
// The field an API error named and the message shown beside it: both go once the field is changed.
let pointed = null; // {field, region}

export function setup({ submit }) {
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
  form.addEventListener("input", (event) => {
    if (pointed?.field === event.target) {
      showError(pointed.region, null);
      clearInvalid();
    }
  });
  for (const example of form.querySelectorAll("button.example")) {
    example.addEventListener("click", () => {
      $("prompt").value = example.dataset.prompt;
      $("prompt").focus();
    });
  }
}

// The video models (with `unavailable`: why the server would refuse one now, or null) and the model
// a request naming none gets.
export function setModels(list, serverDefault) {
  const select = $("model");
  const chosen = select.value;
  models.clear();
  defaultModel = serverDefault ?? null;
  select.replaceChildren(new Option(defaultModel ? `server default (${defaultModel})` : "server default", ""));
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

// The model a request from the form runs on: the one chosen, or the server's default.
function currentModel() {
  return models.get($("model").value) ?? models.get(defaultModel) ?? null;
}

// Seconds that add one chunk to a video of `modelId` (an extension continues from the last frame).
export function chunkSeconds(modelId) {
  const model = models.get(modelId);
  return model ? (model.frames_per_chunk - 1) / model.fps : 1;
}

function describeModel() {
  const model = currentModel();
  $("size").placeholder = model ? model.size : "WxH";
  $("model-hint").textContent = model
    ? `${model.id}: ${KINDS[model.kind] ?? model.kind}, native ${model.size} at ${model.fps} fps, ` +
      `${model.frames_per_chunk} frames per chunk${model.kind === "i2v" ? "; needs a first-frame image" : ""}.` +
      (model.unavailable ? ` Unavailable: ${model.unavailable}.` : "")
    : "The server's default model, at its native size.";
  const preset = $("preset");
  const chosen = preset.value;
  preset.replaceChildren(new Option("none", ""));
  for (const p of model?.presets ?? []) {
    const option = new Option(`${p.name} (${p.num_inference_steps} steps, guidance ${p.guidance_scale})`, p.name);
    option.title = p.description ?? "";
    preset.add(option);
  }
  preset.value = [...preset.options].some((o) => o.value === chosen) ? chosen : "";
}

// The form's fields as the API names them, for POST /v1/videos and a live session alike. Empty
// fields are left out so the server's defaults apply. The prompt always goes: an empty one is the
// API's to reject. The first-frame image is apart: `image`, a File or undefined.
export function formFields() {
  const fields = { prompt: form.elements.prompt.value };
  for (const name of TEXT_FIELDS) {
    const value = form.elements[name].value.trim();
    if (value) fields[name] = value;
  }
  const mode = form.elements.attention.value;
  const density = form.elements.density.value;
  if (mode) fields.attention = { mode, ...(mode === "sparse" && density ? { density: Number(density) } : {}) };
  const kind = form.elements.cache.value;
  const threshold = form.elements.cache_threshold.value;
  if (kind) fields.cache = { kind, ...(kind === "first_block" && threshold ? { threshold: Number(threshold) } : {}) };
  const lora = form.elements.lora.value;
  if (lora) {
    const scale = form.elements.lora_scale.value;
    fields.loras = [{ name: lora, ...(scale ? { scale: Number(scale) } : {}) }];
  }
  const fps = form.elements.outputs_fps.value;
  const outputs = [...form.querySelectorAll("input[name=outputs]:checked")].map((box) => box.value);
  if (outputs.length) fields.outputs = outputs.map((format) => ({ format, ...(fps ? { fps: Number(fps) } : {}) }));
  return { fields, image: form.elements.input_reference.files[0] };
}

export function clearInvalid() {
  for (const field of form.querySelectorAll("[aria-invalid]")) field.removeAttribute("aria-invalid");
  pointed = null;
}

// Marks the field an API error names, so the fix is one keystroke away, and moves the message
// (`region`) beside it; a message that names no field goes back under the Generate button.
export function pointAt(err, region) {
  const field = err.param && form.elements[err.param.split(".")[0]];
  if (!(field instanceof HTMLElement)) {
    form.append(region);
    return;
  }
  const fold = field.closest("details");
  if (fold) fold.open = true; // an advanced field
  (field.closest(".fields, fieldset") ?? field).after(region);
  field.setAttribute("aria-invalid", "true");
  pointed = { field, region };
  field.focus();
}
