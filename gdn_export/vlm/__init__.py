"""Vision-language deployment of Qwen3.5 / Qwen3.5-MoE composite checkpoints: the vision tower's
config and weights, multimodal rotary positions, prompts with placeholders, two-file export and
runners (docs/vision.md)."""
