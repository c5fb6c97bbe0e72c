import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))

# Tiny test models gain nothing from threads, and OpenMP threads spinning against another busy
# process can make each op 50x slower; one thread keeps the suite fast and its timing stable.
torch.set_num_threads(1)
