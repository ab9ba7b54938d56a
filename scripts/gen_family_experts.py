#!/usr/bin/env python3
"""Generate the experts/ of family fixtures: LoRA, DoRA and IA3 on all 7 projections and prompt
tuning, trained by PEFT on the fixture's model, with PEFT's greedy references on the fixture's
own prompt (gen_adapters.write_family_experts; 12 new tokens).

Run:   python scripts/gen_family_experts.py smollm3-tiny
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, peft 0.21.2 -- ~/.cache/expert-runtime/bench-venv)

granite-tiny's experts come from gen_granite_fixtures.py, with the same helper.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_adapters import write_family_experts  # noqa: E402

FIX = Path(__file__).resolve().parent.parent / "__test__" / "fixtures"


def main(names):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in names:
        d = FIX / name
        prompt_ids = json.loads((d / "reference.json").read_text())["prompt_ids"]
        if (d / "experts").exists():
            shutil.rmtree(d / "experts")
        print(name)
        write_family_experts(d, name, prompt_ids)


if __name__ == "__main__":
    main(sys.argv[1:] or ["smollm3-tiny"])
