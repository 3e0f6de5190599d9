// The chat panel: a conversation with the server's chat model, an optional image per message
// (sent as a data URL), and the answer streamed in as it is generated.
import * as api from "./api.js";
import { $, el, isEnabled, setEnabled } from "./ui.js";

const form = $("chat-form");
const log = $("chat-log");
const error = $("chat-error");
let model = null; // the chat entry of /v1/models, or null while unknown or absent
let history = []; // the conversation so far, as OpenAI messages
let controller = null; // aborts the answer being streamed

export function setup() {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("input", () => api.showError(error, null)); // the message or max tokens being fixed
  $("chat-stop").addEventListener("click", () => controller?.abort());
  $("chat-clear").addEventListener("click", () => {
    controller?.abort();
    history = [];
    log.replaceChildren();
    api.showError(error, null);
  });
  setModel(null, "loading…");
}

export function setModel(entry, why = "this server runs no chat model") {
  model = entry;
  $("chat-model").textContent = entry ? `(${entry.id}${entry.vision ? ", sees images" : ""})` : `(${why})`;
  for (const field of form.elements) field.disabled = !entry;
  $("chat-image").disabled = !entry?.vision;
}

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`Could not read ${file.name}.`));
    reader.readAsDataURL(file);
  });
}

function message(role, text, image) {
  const body = el("p", { className: "text" }, text);
  const item = el("li", { className: role }, el("span", { className: "role" }, role === "user" ? "You" : "Model"), body);
  if (image) item.append(el("img", { src: image, alt: "the image sent with this message" }));
  log.append(item);
  log.scrollTop = log.scrollHeight;
  return { item, body };
}

async function send() {
  if (!model || controller || !isEnabled($("chat-send"))) return; // one answer at a time
  api.showError(error, null);
  const text = $("chat-input").value;
  const file = $("chat-image").files[0];
  if (!text.trim() && !file) return api.showError(error, new Error("Type a message (or choose an image) first."));
  let image = null;
  try {
    image = file ? await readAsDataURL(file) : null;
  } catch (err) {
    return api.showError(error, err);
  }
  const content = image ? [{ type: "text", text }, { type: "image_url", image_url: { url: image } }] : text;
  const asked = { role: "user", content };
  const mine = message("user", text, image);
  const answer = message("assistant", "");
  answer.body.setAttribute("aria-busy", "true"); // the log reads the answer once, when it is whole
  controller = new AbortController();
  setEnabled($("chat-stop"), true);
  setEnabled($("chat-send"), false);
  let reply = "";
  let finish = null;
  let keep = true; // whether this exchange joins the history sent with the next message
  try {
    const maxTokens = Number($("chat-max").value) || undefined;
    const response = await api.request("v1/chat/completions", {
      method: "POST", signal: controller.signal,
      json: { model: model.id, messages: [...history, asked], stream: true, max_tokens: maxTokens } });
    $("chat-input").value = ""; // accepted: the message is in the log now
    $("chat-image").value = "";
    for await (const { data } of api.events(response)) {
      if (data === "[DONE]") break;
      if (data.error) throw new api.APIError(500, data.error.message, data.error.param, data.error.code);
      const choice = data.choices?.[0];
      if (choice?.delta?.content) {
        reply += choice.delta.content;
        answer.body.textContent = reply;
        log.scrollTop = log.scrollHeight;
      }
      if (choice?.finish_reason) finish = choice;
    }
    if (finish?.finish_reason === "length") answer.item.append(el("small", {}, "(cut off at max tokens)"));
    if (finish?.stop_reason === "repetition") answer.item.append(el("small", {}, "(stopped: it started repeating)"));
  } catch (err) {
    if (err.name === "AbortError") {
      answer.item.append(el("small", {}, "(stopped)"));
    } else {
      api.showError(error, err);
      if (!reply) { // nothing came back: take the message out of the log, back into the box to resend
        mine.item.remove();
        answer.item.remove();
        $("chat-input").value = text;
        keep = false;
      }
    }
  } finally {
    answer.body.removeAttribute("aria-busy");
    if (keep) history.push(asked, { role: "assistant", content: reply });
    controller = null;
    setEnabled($("chat-stop"), false);
    setEnabled($("chat-send"), true);
  }
}
