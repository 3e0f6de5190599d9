// Video played while it is made, with Media Source Extensions: the server's streams are one H.264
// track in fragmented MP4 (an init segment, then one media segment per chunk, their decode times
// already continuous), so appending them in order to one SourceBuffer plays the video so far.
// A StreamPlayer takes segments from anywhere: an HLS playlist (followPlaylist) or a WebSocket.
import * as api from "./api.js";

const POLL_MS = 1000;

// The MSE type of an init segment: "avc1." and the profile, compatibility and level bytes of its
// avcC box. The four letters "avcC" occur in an init segment only as that box's type, so finding
// them is enough; the box's body starts with a version byte, then those three.
export function mimeType(init) {
  const bytes = new Uint8Array(init);
  for (let i = 4; i + 8 <= bytes.length; i++) {
    if (bytes[i] === 0x61 && bytes[i + 1] === 0x76 && bytes[i + 2] === 0x63 && bytes[i + 3] === 0x43) {
      const hex = [...bytes.subarray(i + 5, i + 8)].map((b) => b.toString(16).padStart(2, "0")).join("");
      return `video/mp4; codecs="avc1.${hex}"`;
    }
  }
  throw new Error("The stream's init segment has no H.264 track.");
}

export class StreamPlayer {
  constructor(video) {
    this.video = video;
    this.source = new MediaSource();
    this.url = URL.createObjectURL(this.source);
    this.buffer = null;
    this.closed = false;
    this.started = false; // playing: set at the first media segment
    this.pending = new Promise((resolve) => this.source.addEventListener("sourceopen", resolve, { once: true }));
    video.src = this.url;
  }

  // Appends the init segment (first) or a media segment. A SourceBuffer takes one append at a
  // time, so appends wait for the one before; a rejected append rejects the ones after it too.
  append(segment) {
    this.pending = this.pending.then(() => this.#append(segment));
    return this.pending;
  }

  async #append(segment) {
    if (this.closed) return;
    const init = !this.buffer;
    if (init) {
      const type = mimeType(segment);
      if (!MediaSource.isTypeSupported(type)) throw new Error(`This browser cannot play the stream (${type}).`);
      this.buffer = this.source.addSourceBuffer(type);
      this.buffer.mode = "segments"; // place each fragment at its own decode time
    }
    await appended(this.buffer, segment);
    // Muted, so browsers allow it without a click; a paused player is the user's choice after that.
    if (!init && !this.started) {
      this.started = true;
      this.video.play().catch(() => {}); // interrupted by a new source: nothing to report
    }
  }

  // No more segments: the player may play to the end (and loop).
  end() {
    return this.pending.then(() => {
      if (!this.closed && this.source.readyState === "open") this.source.endOfStream();
    });
  }

  // The element now plays something else: appends still queued are dropped.
  close() {
    this.closed = true;
    URL.revokeObjectURL(this.url);
  }
}

function appended(buffer, segment) {
  return new Promise((resolve, reject) => {
    // "error" comes before "updateend" when the browser cannot decode the segment.
    const done = (event) => {
      buffer.removeEventListener("updateend", done);
      buffer.removeEventListener("error", done);
      if (event.type === "error") reject(new Error("The browser could not decode a segment of the stream."));
      else resolve();
    };
    buffer.addEventListener("updateend", done);
    buffer.addEventListener("error", done);
    buffer.appendBuffer(segment);
  });
}

// Plays an HLS media playlist that grows as a job runs (#EXT-X-PLAYLIST-TYPE:EVENT): reload it
// every second, append the init segment once and each new media segment, and end the stream at
// #EXT-X-ENDLIST. Stops quietly once `player` is closed, or with an AbortError once `signal` aborts.
// `streamUrl` is the video's stream_url: a path from the API's root, resolved here against the page
// like the page's other calls, so that the page also works behind a proxy that adds a prefix.
export async function followPlaylist(player, streamUrl, signal) {
  const playlistUrl = new URL(streamUrl.replace(/^\/(?!\/)/, ""), document.baseURI);
  const fetchSegment = async (uri) => (await api.request(new URL(uri, playlistUrl).href, { signal })).arrayBuffer();
  let mapped = false;
  let played = 0;
  while (!player.closed) {
    const playlist = parsePlaylist(await (await api.request(playlistUrl.href, { signal })).text());
    // Until a chunk is done the playlist lists nothing, not even the init segment.
    if (!mapped && playlist.map) {
      await player.append(await fetchSegment(playlist.map));
      mapped = true;
    }
    for (const uri of mapped ? playlist.segments.slice(played) : []) {
      if (player.closed) return;
      await player.append(await fetchSegment(uri));
      played += 1;
    }
    if (playlist.ended) return player.end();
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

// The parts of a media playlist this player needs; URIs as written (relative to the playlist).
function parsePlaylist(text) {
  const playlist = { map: null, segments: [], ended: false };
  for (const line of text.split(/\r?\n/).map((l) => l.trim())) {
    if (line.startsWith("#EXT-X-MAP:")) playlist.map = /URI="([^"]*)"/.exec(line)?.[1] ?? null;
    else if (line === "#EXT-X-ENDLIST") playlist.ended = true;
    else if (line && !line.startsWith("#")) playlist.segments.push(line);
  }
  return playlist;
}
