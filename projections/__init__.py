"""Read models folded from the log, each rebuildable from position 0 (see PRODUCT.md §2)."""
