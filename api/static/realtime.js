// Live sessions over WS /v1/realtime/video: a video made from the job form's fields while the
// user watches it (its fMP4 stream arrives as binary messages, one fragment per chunk) and steers
// it (a new prompt for the chunks not yet begun). Stop ends the video after the chunk under way;
// closing the socket (leaving the page) cancels it.
import * as api from "./api.js";
import { formFields } from "./form.js";
import { StreamPlayer } from "./stream.js";
import { $, fitPixels, isEnabled, placeInLine, setEnabled } from "./ui.js";

// Browsers cannot set an Authorization header on a WebSocket: the key rides as a subprotocol.
const KEY_PROTOCOL = "vidserve.key.";
const ENDINGS = new Set(["video.completed", "video.failed", "video.cancelled", "video.deleted"]);

const error = $("realtime-error");
// The session on screen: {socket, player, opened, ended, videoId, state, chunks}
let session = null;
let statusChanged = () => {};

export function setup(callbacks) {
  statusChanged = callbacks.statusChanged;
  fitPixels($("realtime-video"), 480);
  $("realtime-start").addEventListener("click", () => {
    if (isEnabled($("realtime-start"))) start();
  });
  $("realtime-stop").addEventListener("click", () => {
    if (isEnabled($("realtime-stop"))) send({ type: "session.stop" });
  });
  $("steer-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!isEnabled($("steer"))) return;
    $("steer-status").textContent = "";
    send({ type: "prompt.update", prompt: $("steer-prompt").value });
  });
}

async function start() {
  session?.player.close();
  api.showError(error, null);
  $("steer-status").textContent = "";
  showPanel();
  const { fields, image } = formFields();
  const create = { type: "session.create", ...fields };
  let socket;
  try {
    if (image) create.image = await dataURL(image); // a session takes its first frame as a data URL
    const key = api.getKey();
    // "vidserve" is the protocol the server names back; the key's own is never echoed.
    socket = new WebSocket(socketURL(), key ? ["vidserve", KEY_PROTOCOL + key] : []);
  } catch (err) {
    return api.showError(error, err);
  }
  socket.binaryType = "arraybuffer";
  const current = { socket, player: new StreamPlayer($("realtime-video")), opened: false, ended: false,
                    videoId: null, state: "connecting…", chunks: 0 };
  session = current;
  socket.addEventListener("open", () => {
    current.opened = true;
    socket.send(JSON.stringify(create));
  });
  socket.addEventListener("message", (event) => {
    if (session === current) receive(current, event.data);
  });
  socket.addEventListener("close", (event) => {
    if (session === current) closed(current, event);
  });
  render(current);
}

function receive(current, data) {
  if (data instanceof ArrayBuffer) {
    current.player.append(data).catch((err) => api.showError(error, err));
    return;
  }
  const message = JSON.parse(data);
  if (message.type === "error") {
    api.showError(error, new api.APIError(null, message.message, message.param, message.code));
    if (current.videoId === null) { // session.create refused: this socket has no session to steer
      current.ended = true;
      current.state = "not started";
      current.socket.close();
    }
  } else if (message.type === "video.created") {
    current.videoId = message.video.id;
    current.state = message.video.status;
    statusChanged(message.video);
  } else if (message.type === "video.queued") {
    current.state = `queued, ${placeInLine(message.position, message.estimated_start_at)}`;
  } else if (message.type === "video.progress") {
    current.state = `in progress · ${message.progress}%`;
  } else if (message.type === "chunk.done") {
    current.chunks = message.index + 1;
  } else if (message.type === "prompt.updated") {
    // Chunks are numbered from 1 on the page, as in the job panel's list.
    $("steer-status").textContent = `The new prompt applies from chunk ${message.from_chunk + 1}.`;
  } else if (message.type === "session.stopping") {
    current.state = "stopping after the chunk under way";
  } else if (ENDINGS.has(message.type)) {
    current.ended = true;
    current.state = message.type.slice("video.".length);
    if (message.video?.error) api.showError(error, new Error(`The video failed: ${message.video.error.message}`));
    current.player.end().catch(() => {}); // a segment that failed to play is reported already
    statusChanged(message.video);
  }
  render(current);
}

// The session plays at the top of the page, as a job does: on a narrow page, far above the form.
// Focus goes to its prompt box, ready to steer, without scrolling past the player.
function showPanel() {
  const panel = $("session");
  panel.hidden = false;
  $("stage-empty").hidden = true;
  const top = panel.getBoundingClientRect().top;
  if (top < 0 || top > window.innerHeight / 3) panel.scrollIntoView({ block: "start" });
  $("steer-prompt").focus({ preventScroll: true });
}

function closed(current, event) {
  if (!current.ended) {
    const reason = event.reason ? `: ${event.reason}` : "";
    api.showError(error, new Error(current.opened
      ? `The server ended the live session early (code ${event.code}${reason}).`
      : "Could not start a live session; if the server needs an API key, enter it under “API key”."));
    current.ended = true;
  }
  render(current);
}

function render(current) {
  const running = current.videoId !== null && !current.ended;
  setEnabled($("realtime-start"), current.ended);
  setEnabled($("realtime-stop"), running);
  setEnabled($("steer"), running);
  const chunks = current.chunks ? ` · ${current.chunks} chunk${current.chunks === 1 ? "" : "s"} done` : "";
  $("realtime-id").textContent = current.videoId ?? "";
  $("realtime-status").textContent = current.state + chunks;
  $("realtime-video").hidden = !current.chunks;
}

function send(message) {
  if (session?.socket.readyState === WebSocket.OPEN) session.socket.send(JSON.stringify(message));
}

function socketURL() {
  const url = new URL("v1/realtime/video", document.baseURI); // relative, like the page's other calls
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

function dataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.addEventListener("load", () => resolve(reader.result));
    reader.addEventListener("error", () => reject(reader.error));
    reader.readAsDataURL(file);
  });
}
