"""Vision-language deployment of Qwen3.5 / Qwen3.5-MoE composite checkpoints: the vision tower's
weights (its config: gdn_export/vision_config.py), multimodal rotary positions, prompts with
placeholders, two-file export and runners, parity (validate.py), which files are which
(detect.py); the command-line parts are gdn_export/cli/vlm.py (docs/vision.md)."""
