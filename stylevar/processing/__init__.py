"""Pixels around the model: decoding and fitting images, the palette step, the guided refinement and
upsampling, output options, and video files in and out."""
