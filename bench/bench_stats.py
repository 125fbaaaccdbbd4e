"""The bench scripts' summary statistics (bench_common.sh puts bench/ on PYTHONPATH)."""
import math

# Student's t at 95% (two-sided) by degrees of freedom; 1.96 beyond.
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(xs):
    """The mean of xs and the half-width of its 95% t-interval (nan for one value)."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, T95.get(n - 1, 1.96) * sd / math.sqrt(n)
