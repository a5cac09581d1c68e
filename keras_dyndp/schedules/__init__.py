"""Per-step clipping and noise schedules, and their calibration to a privacy budget: `schedule` (`DPSchedule`),
`calibration` (`calibrate`, `calibrate_shape`, `calibrate_baseline`) and `budget` (`PrivacyBudget`, which a DP
optimizer takes as its ``schedule`` too).

A `DPSchedule` is the single description of what a dynamic DP-SGD run does: step k (0-based, the paper's t = k + 1)
clips every per-example gradient to L2 norm `clip_norms[k]` and adds Gaussian noise of std `noise_stddevs[k]` to
their SUM; the same schedule gives the event every accountant composes, so training and accounting cannot drift.

`calibrate` builds the paper's schedules (Du et al., "Dynamic Differential-Privacy Preserving SGD"; their shapes:
`DPOptimizerBase`'s ``method``): ``vanilla`` (Abadi et al. 2016), ``growing_mu`` (Eq. 11-14, Alg. 1),
``sensitivity_decay`` (Eq. 15-17) and ``dynamic`` (Alg. 2), and the baselines of its Table 1 (`calibrate_baseline`).
Only mu_0 is solved for: under 'pld' (default) or 'rdp' by a search (`accounting.scale_search`), under 'gdp_clt' (the
paper's) from the extended GDP CLT (Corollary 1), an approximation that can understate epsilon badly
(docs/accounting.md), so the optimizers warn past 5% (`gdp_clt_understatement`).
"""

from keras_dyndp.accounting.scale_search import CalibrationError
from keras_dyndp.schedules.budget import PrivacyBudget
from keras_dyndp.schedules.calibration import GdpCltUnderstatementWarning
from keras_dyndp.schedules.calibration import calibrate
from keras_dyndp.schedules.calibration import calibrate_baseline
from keras_dyndp.schedules.calibration import calibrate_shape
from keras_dyndp.schedules.calibration import gdp_clt_understatement
from keras_dyndp.schedules.schedule import ALL_METHODS
from keras_dyndp.schedules.schedule import BASELINES
from keras_dyndp.schedules.schedule import METHODS
from keras_dyndp.schedules.schedule import Calibration
from keras_dyndp.schedules.schedule import DPSchedule
from keras_dyndp.schedules.schedule import sampling_from_epochs

__all__ = [
    "ALL_METHODS",
    "BASELINES",
    "CalibrationError",
    "Calibration",
    "DPSchedule",
    "GdpCltUnderstatementWarning",
    "METHODS",
    "PrivacyBudget",
    "calibrate",
    "calibrate_baseline",
    "calibrate_shape",
    "gdp_clt_understatement",
    "sampling_from_epochs",
]
