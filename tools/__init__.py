"""Equipment that lives beside the fastnli package, not in its wheel: the default model's train, ship and measure tools."""
