// The result's player: the video plays muted and looping as soon as it can (browsers allow that
// without a click), and its controls sit in a bar under the frame, never over a small clip: play or
// pause, a position slider, the time. Clicking the frame plays or pauses it too.
import { $ } from "./ui.js";

let video = null;

export function setup(element) {
  video = element;
  $("play-toggle").addEventListener("click", toggle);
  video.addEventListener("click", toggle);
  for (const event of ["play", "pause", "timeupdate", "durationchange", "emptied"]) video.addEventListener(event, sync);
  video.addEventListener("loadedmetadata", () => {
    $("player-bar").hidden = false;
    sync();
  });
  $("seek").addEventListener("input", () => {
    const length = duration();
    if (length) video.currentTime = (Number($("seek").value) / 1000) * length;
  });
}

// No video in the player (yet): no bar.
export function reset() {
  $("player-bar").hidden = true;
}

function toggle() {
  if (video.paused) video.play().catch(() => {}); // nothing to play yet
  else video.pause();
}

// A stream still being made has no duration yet: what is buffered so far stands for it.
function duration() {
  if (Number.isFinite(video.duration)) return video.duration;
  return video.buffered.length ? video.buffered.end(video.buffered.length - 1) : 0;
}

function sync() {
  const length = duration();
  const at = Math.min(video.currentTime, length || video.currentTime);
  $("play-toggle").textContent = video.paused ? "Play" : "Pause";
  $("seek").value = length ? String(Math.round((at / length) * 1000)) : "0";
  $("seek").setAttribute("aria-valuetext", `${at.toFixed(1)} of ${length.toFixed(1)} seconds`);
  $("play-time").textContent = `${at.toFixed(1)} / ${length.toFixed(1)} s`;
}
