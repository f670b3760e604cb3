#!/bin/bash
# Trains one setting of the fronts study and evaluates it; every step is skipped when its result exists, so a
# stopped study continues where it stopped. Usage (repository root): bash one.sh RUNS NAME SEED
# (PY: the python to use; AA_IMAGES: AutoAttack on the first N test images, 0 skips it; default 2000;
# EXTRA: more overrides for a smoke test, e.g. "data.train_per_class=20 train.epochs=1").
set -euo pipefail
RUNS=$1 NAME=$2 SEED=$3 PY=${PY:-python} AA_IMAGES=${AA_IMAGES:-2000}
source results/adversarial/fronts/settings.sh
for s in "${SETTINGS[@]}"; do
  read -r name recipe overrides <<< "$s"
  [ "$name" = "$NAME" ] && break
done
[ "$name" = "$NAME" ] || { echo "unknown setting $NAME" >&2; exit 2; }
dir=$RUNS/$NAME/seed$SEED
has() { [ -f $dir/robust_eval.json ] && grep -q "\"$1" $dir/robust_eval.json; }
if [ -f $dir/config.yaml ]; then
  $PY -m kdcollapse train --resume $dir --quiet
else
  $PY -m kdcollapse train --config configs/adversarial/fashion_mnist_$recipe.yaml run_dir=$dir seed=$SEED $DATA \
    $overrides train.progress=false ${EXTRA:-} --quiet
fi
has "pgd-20 Linf eps=0.1 last" || $PY -m kdcollapse robust-eval $dir --eps 0.1 --attacks pgd --no-progress > /dev/null
[ "$AA_IMAGES" = 0 ] || has "autoattack-standard Linf eps=0.1 last" || \
  $PY -m kdcollapse robust-eval $dir --eps 0.1 --attacks standard --n-examples $AA_IMAGES --no-progress > /dev/null
echo "$dir done"
