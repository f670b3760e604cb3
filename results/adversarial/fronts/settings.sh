# The settings of the clean-vs-robust fronts (sourced by run.sh): NAME RECIPE OVERRIDES, one a line.
# TRADES over beta (its one weight); IKL-AT over its two weights, the class-weighted MSE (paper alpha, official
# --beta) and the soft-label CE (paper beta, official --alpha), around the official (20, 4): the MSE weight
# halved and doubled, and the CE weight halved (a run here costs 15-25 min on the shared 2-core machine).
SETTINGS=(
  "trades_b1 trades method.beta=1"
  "trades_b3 trades method.beta=3"
  "trades_b6 trades method.beta=6"
  "trades_b9 trades method.beta=9"
  "ikl_at_m10_c4 ikl_at method.mse_weight=10 method.ce_weight=4"
  "ikl_at_m20_c4 ikl_at method.mse_weight=20 method.ce_weight=4"
  "ikl_at_m40_c4 ikl_at method.mse_weight=40 method.ce_weight=4"
  "ikl_at_m20_c2 ikl_at method.mse_weight=20 method.ce_weight=2"
)
# The data of every run: 1,000 training images per class (10,000), all 10,000 test images.
DATA="data.train_per_class=1000"
