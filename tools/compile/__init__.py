"""The compile tool (tools/compile_token2wav.py is its entry): a model family's token2wav stages
exported and compiled into AOTInductor packages that the worker loads through libtorch
(src/model/compiled.rs). By concept:

    cli.py        the flags and the loop over stages (compile, or one of the checks)
    families/     what differs per model family: its stages, their example inputs and dynamic
                  shapes, the forms each may be computed in (families/__init__.py: the interface;
                  cosyvoice2/, the default; cosyvoice3/, the DiT and the causal HiFT)
    layouts.py    the computation's forms: time-major layouts, Mish forms, fused projections, padded
                  vocoder channels, phase-split dilations (centred or causal)
    vocoder.py    the HiFT body both families' `hift` stage compiles, in their layouts (centred,
                  causal), with its example inputs and dynamic shapes
    attention.py  the estimator's attention forms (SDPA, FlexAttention, FlashAttention, cuDNN)
    export.py     torch.export and AOTInductor packaging of one stage; --tuning, --inductor-option
    packages.py   where packages are filed (compiled/<arch>-torch<ver>-<precision>/), their
                  metadata, written through .partial/ and renamed
    checks.py     --eager-check, --check (in a child process), --cuda-kernels, require_on_device
    fake_cuda.py  inductor's CUDA code generated without a GPU (--cuda-kernels)
"""
import os
import sys

# The reference code's builders (tools/make_parity_fixtures.py) sit beside this package.
_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)
