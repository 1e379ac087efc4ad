# The configuration the contract runs: exec'd by train.py over its globals.
n_layer = 4
n_head = 16
n_embd = 64
block_size = 32
max_iters = 5000  # the runner stops the job once its window is measured
