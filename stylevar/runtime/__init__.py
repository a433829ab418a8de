"""Running a loaded model: inference preparation (packed layers, bf16, compilation), torchrun's process group,
and the speed benchmark behind `stylevar bench`."""
