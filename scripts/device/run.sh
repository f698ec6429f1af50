#!/usr/bin/env bash
# One way to run a GPU script: `scripts/device/run.sh TARGET [KEY=VALUE]...` on the device machine,
# in the device tool's copy of the repository, after `scripts/device/pack.sh` here made what the
# target carries. A KEY=VALUE sets one of the target's knobs, as the environment does; each
# target's knobs, defaults and outputs head its file (`run.sh help TARGET` prints them). Results go
# to OUT (the device tool sets it; else /tmp/TARGET-out).
#
# target     one call                                                       carry (pack.sh)
# parity     LLM parity, token2wav parity (bf16/fp16 fixtures built there), .whl .t2w, for the LLM part
#            the tiny model's packages compiled there vs the eager port;    models/cosyvoice2-llm-parity
#            PARTS=tts: the text pipeline's GPU tests on the tiny text      models/cosyvoice2-tiny
#            model built there                                              (tts: not the tiny model)
# llm        the LLM's GPU tests, then `bench llm` (graphs, eager) and the  .whl .t2w
#            reference Qwen2LM at batch 1 on a full-size random LLM         models/cosyvoice2-llm-parity
#                                                                           models/cosyvoice2-tiny
# token2wav  the full-size random token2wav's packages compiled (and        .whl .t2w
#            VARIANTS), benched with the eager port (and at SWEET), and
#            the reference token2wav at batch 1
# text-e2e   text jobs through RabbitMQ, Postgres and a worker on the       .whl .t2w .e2e
#            full-size random CosyVoice2, NVML sampled, a summary           models/cosyvoice2-llm-parity
#            (STAGE=model, then e2e: two calls on one warm machine)
# headline   token2wav (default and the strided layout, eager, sweet        .whl .t2w
#            spot 256, reference), then calibrate; each part within its
#            limit, the whole inside 600 s
# calibrate  `voxbatch calibrate` of the compiled directory (compiled       .whl .t2w
#            first if absent), cudnn_benchmark off and on
# e2e        the reference model's drain through the services against       .t2w .e2e
#            the model-only policy bench (issue 4)
# scaling    e2e on 1 GPU, then on N (kinds of several GPUs; not yet run)   .t2w .e2e
# cv3-token2wav  CosyVoice3's token2wav: a full-size random model built from     .whl .cv3
#            the reference code, the eager port (and COMPILE=1 the packages)   .t2w/voxbatch.xz
#            benched, the reference at batch 1
#
# Layout: targets/TARGET.sh (one file per target, sourced here after the shared setup
# lib/common.sh: OUT, PY, libtorch, the carried wheels and binaries); lib/cv2full.sh (the full-size
# random CosyVoice2 built there), lib/services.sh (RabbitMQ and Postgres, started and stopped by
# pid), lib/text_e2e_summary.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
TARGETS="parity llm token2wav text-e2e headline calibrate e2e scaling cv3-token2wav"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
# A target's own header: the comment lines its file begins with.
target_help() { sed -n '/^#/!q; s/^# \{0,1\}//p' "scripts/device/targets/$1.sh"; }

case "${1:-}" in
  ""|-h|--help|help)
    if [ -n "${2:-}" ] && [ -f "scripts/device/targets/$2.sh" ]; then target_help "$2"; exit 0; fi
    usage; [ -n "${1:-}" ] && exit 0; exit 2 ;;
esac
TARGET=$1; shift
case " $TARGETS " in
  *" $TARGET "*) ;;
  *) echo "unknown target '$TARGET': one of $TARGETS (scripts/device/run.sh help)" >&2; exit 2 ;;
esac
for kv in "$@"; do
  [[ "$kv" =~ ^[A-Z_][A-Z0-9_]*= ]] || { echo "'$kv': KEY=VALUE, the key one of the target's knobs (run.sh help $TARGET)" >&2; exit 2; }
  export "${kv?}"
done
export TARGET
source scripts/device/lib/common.sh
source "scripts/device/targets/$TARGET.sh"
