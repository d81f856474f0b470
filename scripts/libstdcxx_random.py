"""libstdc++'s std::mt19937_64 and uniform_int_distribution, bit for bit, so that the side-by-side
benchmarks (bench_transformers.py, bench_trl.py) can rebuild the random prompts and prompt orders
rlhf draws. Standard library only."""

MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64, bit for bit."""
    N, M = 312, 156

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, self.N):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.i = self.N

    def __call__(self):
        if self.i >= self.N:
            mt = self.mt
            for k in range(self.N):
                y = (mt[k] & 0xFFFFFFFF80000000) | (mt[(k + 1) % self.N] & 0x7FFFFFFF)
                v = mt[(k + self.M) % self.N] ^ (y >> 1)
                mt[k] = v ^ 0xB5026F5AA96619E9 if y & 1 else v
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def uniform_below(gen, n):
    """libstdc++ (GCC >= 11) uniform_int_distribution(0, n-1) over a 64-bit engine: Lemire's
    multiply-shift with rejection."""
    p = gen() * n
    if (p & MASK64) < n:
        threshold = ((1 << 64) - n) % n
        while (p & MASK64) < threshold:
            p = gen() * n
    return p >> 64
