"""Training the small video and vision-language models of a procedural "shapes world", and a classical scorer for
their outputs."""
