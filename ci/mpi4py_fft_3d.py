# A 3-D complex FFT round trip, distributed over MPI ranks with mpi4py-fft
# (slab decomposition: one global Alltoall(w) per transform).
import sys
import numpy as np
from mpi4py import MPI
from mpi4py_fft import PFFT, newDistArray

n = int(sys.argv[1]) if len(sys.argv) > 1 else 192
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 100
fft = PFFT(MPI.COMM_WORLD, [n, n, n], dtype=np.complex128)
u = newDistArray(fft, False)
u[:] = np.random.default_rng(MPI.COMM_WORLD.rank).random(u.shape)
for i in range(iters):
    # Fresh output arrays each step: the allocator churn of a typical script.
    u_hat = fft.forward(u, newDistArray(fft, True))
    u2 = fft.backward(u_hat, newDistArray(fft, False))
err = MPI.COMM_WORLD.allreduce(float(np.abs(u2 - u).max()), op=MPI.MAX)
if MPI.COMM_WORLD.rank == 0:
    print(f"mpi4py-fft {n}^3 x{iters}: max round-trip error {err:.3e}")
