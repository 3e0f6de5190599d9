// The playground's entry point: the API key, then models, the job form, live sessions, the gallery and chat.
import * as api from "./api.js";
import * as chat from "./chat.js";
import * as form from "./form.js";
import * as gallery from "./gallery.js";
import * as jobs from "./job.js";
import * as realtime from "./realtime.js";
import { $ } from "./ui.js";

const keyBox = $("key-box");
const keyStatus = $("key-status");

// Any 401 opens the key box and says why; the call that failed shows the server's message too.
window.addEventListener("vidserve:unauthorized", () => {
  keyBox.open = true;
  keyBox.classList.add("needed");
  keyStatus.textContent = api.getKey() ? "The server refused this API key; enter another one."
                                       : "This server needs an API key: enter it here.";
});

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("api-key").value.trim();
  const remember = $("remember").checked;
  api.setKey(key, remember);
  $("api-key").value = "";
  keyBox.classList.remove("needed");
  keyStatus.textContent = key ? `Key saved ${remember ? "on this device" : "for this tab"}.` : "No key set.";
  for (const region of document.querySelectorAll(".error")) api.showError(region, null);
  start();
});

$("forget").addEventListener("click", () => {
  api.setKey("", false);
  keyStatus.textContent = "Key forgotten.";
});

async function loadModels() {
  try {
    const [{ data }, loras, availability] = await Promise.all([
      api.getJSON("v1/models"), api.getJSON("v1/loras"), api.getJSON("playground/models")]);
    // Why a model would be refused now (its weights absent, no worker holding it); null if it would not.
    const refusal = new Map(availability.data.map((m) => [m.id, m.reason]));
    const video = data.filter((m) => m.kind !== "chat");
    form.setModels(video.map((m) => ({ ...m, unavailable: refusal.get(m.id) ?? null })), availability.default_model);
    form.setLoras(loras.data);
    chat.setModel(data.find((m) => m.kind === "chat") ?? null);
  } catch (err) {
    api.showError($("job-error"), err);
    chat.setModel(null, "unavailable until the models load");
  }
}

function start() {
  loadModels();
  gallery.load();
}

jobs.setup({ statusChanged: () => gallery.refreshIfFirst() });
gallery.setup({ show: jobs.show, cancel: jobs.cancel });
realtime.setup({ statusChanged: () => gallery.refreshIfFirst() });
chat.setup();
if (api.getKey()) keyStatus.textContent = "Using the saved key.";
$("remember").checked = api.keyRemembered();
start();
