"""The LLM / vision-language path: model layer, continuous-batching engine, sampling,
loop detection and structured outputs. One engine serves chat requests and the video
path's prompt extension and last-frame captions."""
