# The data of the short distillation studies (sourced by each study's jobs.sh): `task K` sets cfgdir (the
# recipes of the task) and sub (the subsets: 2,000 training images with validation carved from them, 1,000 test
# images) for K = 10 (Fashion-MNIST) or K = 100 (fashion_mnist_pairs).
task() {
  if [ "$1" = 10 ]; then
    cfgdir=configs/fashion_mnist sub="data.train_per_class=200 data.val_per_class=30 data.test_per_class=100"
  else
    cfgdir=configs/fashion_mnist_pairs sub="data.train_per_class=20 data.val_per_class=5 data.test_per_class=10"
  fi
}
