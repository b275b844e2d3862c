"""Money: what GPU-hours cost, from the farm's rate card and the clouds' price lists."""
