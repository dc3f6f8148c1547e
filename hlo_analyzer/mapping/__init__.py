"""The hardware-mapping layer of the analyzer (docs/design.md): it maps what the measuring
visitors found onto a chip and a system, and adds its sections to their Report from above."""
