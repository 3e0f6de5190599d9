"""Media without torch, so the API process and the CLI can import it: video I/O (`video_io.py`),
user images (`images.py`), and the modules beside them (renditions, HLS, drift, quality...).
Frames are always uint8 numpy arrays shaped [N, H, W, 3] (RGB)."""

from vidserve.media.images import decode_data_url, load_image
from vidserve.media.video_io import (PROBE_TIMEOUT_SECONDS, VideoInfo, check_frames, encode_mp4, ffmpeg_exe,
                                     last_frame, probe_video, read_last_frame, read_video, read_video_bytes,
                                     save_thumbnail, stderr_tail)

__all__ = ["PROBE_TIMEOUT_SECONDS", "VideoInfo", "check_frames", "decode_data_url", "encode_mp4", "ffmpeg_exe",
           "last_frame", "load_image", "probe_video", "read_last_frame", "read_video", "read_video_bytes",
           "save_thumbnail", "stderr_tail"]
