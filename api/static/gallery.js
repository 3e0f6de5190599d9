// Recent jobs, a page at a time from GET /v1/videos (newest first), with status, timings and
// drift; each row can be shown in the live panel or cancelled.
import * as api from "./api.js";
import { $, TERMINAL, driftSummary, el, isEnabled, setEnabled, statusText, timings } from "./ui.js";

const PAGE = 10;
const rows = $("gallery-rows");
const error = $("gallery-error");
const thumbnails = new Map(); // video id -> promise of an object URL: each is fetched once
let cursors = [null]; // the `after` cursor of each page visited; the last one is on screen
let actions = {};
let timer = null;

export function setup(callbacks) {
  actions = callbacks; // {show(video), cancel(id)}
  $("refresh").addEventListener("click", load);
  $("older").addEventListener("click", () => {
    if (!isEnabled($("older"))) return;
    cursors.push($("older").dataset.after);
    load();
  });
  $("newer").addEventListener("click", () => {
    if (!isEnabled($("newer"))) return;
    cursors.pop();
    load();
  });
}

// The first page is the one new jobs appear on; other pages stay put while the user reads them.
export function refreshIfFirst() {
  if (cursors.length === 1) load();
}

export async function load() {
  clearTimeout(timer);
  const query = new URLSearchParams({ limit: PAGE, order: "desc" });
  if (cursors.at(-1)) query.set("after", cursors.at(-1));
  let page;
  try {
    page = await api.getJSON(`v1/videos?${query}`);
  } catch (err) {
    api.showError(error, err);
    return;
  }
  api.showError(error, null);
  // Rebuilding the rows would drop keyboard focus inside them: remember which button had it.
  const focused = rows.contains(document.activeElement) ? { ...document.activeElement.dataset } : null;
  rows.replaceChildren(...page.data.map(row));
  if (focused?.id) {
    const same = rows.querySelector(`button[data-id="${focused.id}"][data-action="${focused.action}"]`);
    (same ?? rows.querySelector(`button[data-id="${focused.id}"]`))?.focus();
  }
  $("older").dataset.after = page.last_id ?? "";
  setEnabled($("older"), page.has_more);
  setEnabled($("newer"), cursors.length > 1);
  $("page-info").textContent = page.data.length ? `Page ${cursors.length}` : "No jobs yet.";
  // Nothing pushes status changes to this list, so look again while any shown job is running.
  if (page.data.some((video) => !TERMINAL.has(video.status))) timer = setTimeout(load, 3000);
}

function row(video) {
  const thumb = el("td");
  if (video.status === "completed") thumb.append(thumbnail(video.id));
  const params = [video.size, video.seconds && `${video.seconds} s`, video.num_inference_steps &&
                  `${video.num_inference_steps} steps`, video.seed !== null && `seed ${video.seed}`,
                  video.attention?.mode && `${video.attention.mode} attention`].filter(Boolean).join(" · ");
  const show = el("button", { type: "button", textContent: "Show" });
  show.setAttribute("aria-label", `Show ${video.id} in the player`);
  show.addEventListener("click", () => actions.show(video));
  const buttons = el("td", { className: "actions" }, show);
  if (!TERMINAL.has(video.status)) {
    const cancel = el("button", { type: "button", textContent: "Cancel" });
    cancel.setAttribute("aria-label", `Cancel ${video.id}`);
    cancel.addEventListener("click", async () => {
      try {
        await actions.cancel(video.id);
        load();
      } catch (err) {
        api.showError(error, err);
      }
    });
    buttons.append(cancel);
  }
  for (const [action, button] of [["show", show], ["cancel", buttons.children[1]]]) {
    if (button) Object.assign(button.dataset, { id: video.id, action });
  }
  const times = timings(video).map(([name, text]) => `${name} ${text}`).join(", ") || "—";
  const tr = el("tr", {},
    thumb,
    el("td", { className: "prompt", title: video.prompt ?? "" }, video.prompt ?? ""),
    el("td", {}, el("strong", {}, video.model), el("br"), params),
    el("td", { className: `status ${video.status}` }, statusText(video)),
    el("td", {}, times),
    el("td", {}, driftSummary(video.chunks)),
    buttons);
  tr.dataset.id = video.id;
  return tr;
}

function thumbnail(id) {
  const img = el("img", { alt: "", width: 64, height: 64 }); // decorative: the prompt is in the next cell
  if (!thumbnails.has(id)) {
    const url = api.blobURL(`v1/videos/${id}/content?variant=thumbnail`);
    url.catch(() => thumbnails.delete(id)); // try again next time
    thumbnails.set(id, url);
  }
  thumbnails.get(id).then((url) => { img.src = url; }, () => img.remove()); // not worth an error message
  return img;
}
