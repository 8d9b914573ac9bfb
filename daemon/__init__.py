"""The process and kernel boundary: CLI, mount lifecycle, FUSE protocol layer (:mod:`.kernel`),
operations adapter (:mod:`.ops`), stats export, warm, service integration."""
