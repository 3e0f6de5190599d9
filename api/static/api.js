// Talking to the public API from the browser: the API key, JSON calls, errors shaped
// {"error": {"message", "param", ...}}, media as blobs, and Server-Sent Events read with
// fetch. Every call carries the key as a header, which <video src>, <img src> and
// EventSource cannot do; that is why media are fetched as blobs and SSE is parsed by hand.
// Paths are relative ("v1/..."), so the page also works behind a proxy that adds a prefix.

const KEY = "vidserve.apiKey";

export function getKey() {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY) ?? "";
}

export function keyRemembered() {
  return localStorage.getItem(KEY) !== null;
}

// sessionStorage unless asked to remember: a key typed on a shared machine should die with the tab.
export function setKey(key, remember) {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
  if (key) (remember ? localStorage : sessionStorage).setItem(KEY, key);
}

export class APIError extends Error {
  constructor(status, message, param = null, code = null) {
    super(message);
    this.status = status;
    this.param = param;
    this.code = code;
  }
}

// One readable sentence for the page: the server's message, the field it names, and what to do.
export function describe(err) {
  if (!(err instanceof APIError)) return err.message || String(err); // the page's own checks
  let text = err.message;
  if (err.param && !text.includes(err.param)) text += ` (field: ${err.param})`;
  if (err.status === 401) text += " — enter an API key under “API key” at the top of the page.";
  if (err.status === 429) text += " — the server is busy; try again in a moment.";
  return text;
}

export async function request(path, { method = "GET", json, body, signal } = {}) {
  const headers = new Headers();
  const key = getKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  if (json !== undefined) {
    headers.set("Content-Type", "application/json");
    body = JSON.stringify(json);
  }
  let response;
  try {
    response = await fetch(path, { method, headers, body, signal });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new APIError(0, `Could not reach the server (${err.message}).`);
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

async function errorOf(response) {
  let error = {};
  try {
    error = (await response.json()).error ?? {};
  } catch {
    // not our JSON (a proxy's HTML page, say): fall back to the status line
  }
  if (response.status === 401) window.dispatchEvent(new CustomEvent("vidserve:unauthorized"));
  return new APIError(response.status, error.message || `HTTP ${response.status} ${response.statusText}`,
                      error.param ?? null, error.code ?? null);
}

export async function getJSON(path, options) {
  return (await request(path, options)).json();
}

// An object URL for a media file; the caller revokes it when the element goes away.
export async function blobURL(path, options) {
  return URL.createObjectURL(await (await request(path, options)).blob());
}

// Yields {event, data} for each Server-Sent Event of a fetch response; data is parsed JSON,
// or the raw string where it is not JSON (the chat stream's final "[DONE]").
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith(":")) continue; // a keep-alive comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = text;
        else if (field === "data") data.push(text);
      }
      if (!data.length) continue;
      const raw = data.join("\n");
      let parsed = raw;
      try {
        parsed = JSON.parse(raw);
      } catch {
        // "[DONE]"
      }
      yield { event, data: parsed };
    }
  }
}

// Shows an error (or clears it with null) in one of the page's role="alert" regions.
export function showError(region, err) {
  region.textContent = err ? describe(err) : "";
  region.hidden = !err;
}
