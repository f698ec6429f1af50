#!/usr/bin/env python3
"""The reference text normalisation for tests/data/normalize_cases.tsv: CosyVoice's
`CosyVoiceFrontEnd.text_normalize` without ttsfrd and without splitting — WeTextProcessing's grammars
as the `wetext` package runs them (ZhNormalizer(remove_erhua=False, full_to_half=False), EnNormalizer)
and the clean-ups of cosyvoice/utils/frontend_utils.py (PyPI token2wav-cosyvoice), inflect for digits.

Needs wetext 0.1.8 with its runtime (kaldifst) and inflect, apart from the project venv:
  .venv/bin/pip install --target .run/tn-site wetext==0.1.8 inflect
  PYTHONPATH=.run/tn-site .venv/bin/python tools/normalize_reference.py tests/data/normalize_inputs.txt > OUT.tsv
Prints `input<TAB>reference` per case; where the reference itself fails (wetext 0.1.8 asserts on
"It cost $18446744073709551616."), the reference column says so: `(reference fails: AssertionError)`.
"""
import re
import sys

import inflect
from wetext import Normalizer

sys.modules.setdefault("regex", re)  # frontend_utils' is_only_punctuation is not used here
from cosyvoice.utils.frontend_utils import (contains_chinese, remove_bracket, replace_blank,  # noqa: E402
                                            replace_corner_mark, spell_out_number)

zh = Normalizer(lang="zh", operator="tn", remove_erhua=False, full_to_half=False)
en = Normalizer(lang="en", operator="tn")
parser = inflect.engine()


def reference(text):
    text = text.strip()
    if contains_chinese(text):
        text = zh.normalize(text)
        text = text.replace("\n", "")
        text = replace_blank(text)
        text = replace_corner_mark(text)
        text = text.replace(".", "。")
        text = text.replace(" - ", "，")
        text = remove_bracket(text)
        return re.sub(r"[，,、]+$", "。", text)
    return spell_out_number(en.normalize(text), parser)


def reference_or_failure(text):
    try:
        return reference(text)
    except Exception as e:  # noqa: BLE001 - the table records how the reference fails
        return f"(reference fails: {type(e).__name__})"


for line in open(sys.argv[1], encoding="utf-8"):
    line = line.rstrip("\n")
    if line and not line.startswith("#"):
        print(f"{line}\t{reference_or_failure(line)}")
