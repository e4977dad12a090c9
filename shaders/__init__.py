"""WGSL sources, one file per op family. Read them with webinfer.kernels.library.load_source()."""
