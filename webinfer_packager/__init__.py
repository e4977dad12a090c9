"""CPython tooling for webinfer (numpy allowed): the packer, package verification, the numpy reference model,
evaluation, benchmarks, the static-site builder and the command line. Installed as `webinfer_packager`.
The runtime (webinfer/) never imports this package."""
