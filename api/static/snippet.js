// "Copy as curl / Python": a request the page sent (or one that makes a video again) written out
// as a shell command and as openai SDK code, so the same job can be made from a script. The API
// key never goes into them: they read it from $VIDSERVE_API_KEY where the server needs one.
//
// A request: {kind: "create" | "remix" | "extend", fields, image?, source?} — `fields` as the page
// sends them (formFields), `image` a File (create only), `source` the video a remix starts from.

// Written as numbers when they are one (the form keeps what was typed, so a long seed keeps its digits).
const NUMBERS = new Set(["seed", "num_inference_steps", "guidance_scale"]);
const SDK_CREATE = new Set(["prompt", "model", "seconds", "size"]); // create()'s own parameters; the rest is extra_body

export function path(request) {
  if (request.kind === "remix") return `videos/${request.source}/remix`;
  return request.kind === "extend" ? "videos/extensions" : "videos";
}

const number = (name, value) => NUMBERS.has(name) && typeof value === "string" && /^-?\d+(\.\d+)?$/.test(value);

// JSON text of the fields, numbers as numbers.
function json(fields) {
  const items = Object.entries(fields).map(([name, value]) =>
    `${JSON.stringify(name)}: ${number(name, value) ? value : JSON.stringify(value)}`);
  return `{${items.join(", ")}}`;
}

// One shell word: single-quoted, a quote inside written '\''.
const shell = (text) => `'${String(text).replace(/'/g, "'\\''")}'`;

// `base`: the API's /v1/ URL; `keyed`: the server needs a key.
export function curl(request, base, keyed) {
  const lines = [`curl -s ${shell(base + path(request))}`];
  if (keyed) lines.push(`-H "Authorization: Bearer $VIDSERVE_API_KEY"`);
  if (request.image) {
    // --form-string: a value is sent as it is, even one that starts with @ or <.
    for (const [name, value] of Object.entries(request.fields)) {
      lines.push(`--form-string ${shell(`${name}=${typeof value === "string" ? value : JSON.stringify(value)}`)}`);
    }
    lines.push(`-F ${shell(`input_reference=@${request.image.name}`)}`);
  } else {
    lines.push("-H 'Content-Type: application/json'", `-d ${shell(json(request.fields))}`);
  }
  return lines.join(" \\\n  ");
}

// A Python literal: JSON's, with Python's True, False and None.
function literal(value, name = null) {
  if (value === null || value === undefined) return "None";
  if (typeof value === "boolean") return value ? "True" : "False";
  if (typeof value === "number" || number(name, value)) return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map((v) => literal(v)).join(", ")}]`;
  return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${literal(v, k)}`).join(", ")}}`;
}

function call(name, args, extra) {
  const lines = args.map(([key, value]) => `    ${key}=${value},`);
  if (Object.keys(extra).length) lines.push(`    extra_body=${literal(extra)},`);
  return `video = client.videos.${name}(\n${lines.join("\n")}\n)`;
}

export function python(request, base) {
  const { prompt, ...rest } = request.fields;
  const head = ["import os", ...(request.kind === "extend" ? ["import openai"] : []), "from openai import OpenAI", "",
                "client = OpenAI(", `    base_url=${JSON.stringify(base.replace(/\/$/, ""))},`,
                '    api_key=os.environ.get("VIDSERVE_API_KEY", "unused"),', ")"];
  let body;
  if (request.kind === "remix") {
    body = call("remix", [["video_id", JSON.stringify(request.source)], ["prompt", literal(prompt)]], rest);
  } else if (request.kind === "extend") {
    const { seconds, video, ...extra } = rest;
    // The SDK's `video` takes only an upload: a reference to a video rides in extra_body.
    body = call("extend", [["prompt", literal(prompt)], ["seconds", literal(String(seconds))],
                           ["video", "openai.omit"]], { ...extra, video });
  } else {
    const own = Object.entries(rest).filter(([name]) => SDK_CREATE.has(name)).map(([name, v]) => [name, literal(v)]);
    const extra = Object.fromEntries(Object.entries(rest).filter(([name]) => !SDK_CREATE.has(name)));
    if (request.image) own.push(["input_reference", `open(${JSON.stringify(request.image.name)}, "rb")`]);
    body = call("create", [["prompt", literal(prompt)], ...own], extra);
  }
  return [...head, body, "print(video.id, video.status)"].join("\n");
}
