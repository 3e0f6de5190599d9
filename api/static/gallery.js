// Recent jobs, a page at a time from GET /v1/videos (newest first), as cards with status, timings
// and drift; each can be shown in the result panel or cancelled.
import * as api from "./api.js";
import { $, TERMINAL, driftSummary, el, fitPixels, isEnabled, setEnabled, statusText, timings } from "./ui.js";

const PAGE = 10;
const NO_PICTURE = { queued: "waiting…", in_progress: "being made…", failed: "no video", cancelled: "no video" };
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

// The list is busy while a page loads; with no rows to keep on screen meanwhile, it says so.
export async function load() {
  clearTimeout(timer);
  const query = new URLSearchParams({ limit: PAGE, order: "desc" });
  if (cursors.at(-1)) query.set("after", cursors.at(-1));
  const hasRows = rows.querySelector("tr[data-id]") !== null;
  if (!hasRows) rows.replaceChildren(notice("Loading videos…"));
  rows.setAttribute("aria-busy", "true");
  let page;
  try {
    page = await api.getJSON(`v1/videos?${query}`);
  } catch (err) {
    api.showError(error, err);
    if (!hasRows) rows.replaceChildren(notice("Could not load videos."));
    return;
  } finally {
    rows.removeAttribute("aria-busy");
  }
  api.showError(error, null);
  // Rebuilding the rows would drop keyboard focus inside them: remember which button had it.
  const focused = rows.contains(document.activeElement) ? { ...document.activeElement.dataset } : null;
  if (page.data.length) rows.replaceChildren(...page.data.map(row));
  else rows.replaceChildren(notice(cursors.length > 1 ? "No older videos." : "No videos yet."));
  if (focused?.id) {
    const same = rows.querySelector(`button[data-id="${focused.id}"][data-action="${focused.action}"]`);
    (same ?? rows.querySelector(`button[data-id="${focused.id}"]`))?.focus();
  }
  $("older").dataset.after = page.last_id ?? "";
  setEnabled($("older"), page.has_more);
  setEnabled($("newer"), cursors.length > 1);
  $("page-info").textContent = page.data.length ? `Page ${cursors.length}` : "";
  // Nothing pushes status changes to this list, so look again while any shown job is running.
  if (page.data.some((video) => !TERMINAL.has(video.status))) timer = setTimeout(load, 3000);
}

// A row across the whole table, in place of the videos: loading, none, or failed.
function notice(text) {
  return withRole(el("tr", { className: "notice" }, withRole(el("td", { colSpan: 7 }, text), "cell")), "row");
}

// The table is laid out as cards (style.css); explicit roles keep it a table for assistive technology.
function withRole(node, role) {
  node.setAttribute("role", role);
  return node;
}

function row(video) {
  const thumb = el("td", { className: "thumb" });
  thumb.append(video.status === "completed" ? thumbnail(video.id) : NO_PICTURE[video.status] ?? "");
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
  const cells = [thumb,
    el("td", { className: "prompt", title: video.prompt ?? "" }, video.prompt ?? ""),
    el("td", { className: "meta" }, el("strong", {}, video.model), el("br"), params),
    el("td", { className: `status ${video.status}` }, statusText(video)),
    el("td", { className: "timings" }, times),
    el("td", { className: "drift" }, driftSummary(video.chunks)),
    buttons];
  const tr = withRole(el("tr", {}, ...cells.map((cell) => withRole(cell, "cell"))), "row");
  tr.dataset.id = video.id;
  return tr;
}

function thumbnail(id) {
  const img = fitPixels(el("img", { alt: "" }), 128, 128); // decorative: the prompt is in the next cell
  if (!thumbnails.has(id)) {
    const url = api.blobURL(`v1/videos/${id}/content?variant=thumbnail`);
    url.catch(() => thumbnails.delete(id)); // try again next time
    thumbnails.set(id, url);
  }
  thumbnails.get(id).then((url) => { img.src = url; }, () => img.remove()); // not worth an error message
  return img;
}
