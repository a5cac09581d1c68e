"""Empirical privacy audit in one training run: canaries in, lower bounds on epsilon out (docs/audit.md).

`bounds`: the analysis from canary scores. `white_box`: Dirac gradient canaries through the real pipeline.
`black_box`: canaries in a user's data, scored by the final model's loss.
"""

from keras_dyndp.audit.black_box import black_box_audit
from keras_dyndp.audit.bounds import AuditResult
from keras_dyndp.audit.bounds import audit_from_scores
from keras_dyndp.audit.bounds import fdp_epsilon_lower_bound
from keras_dyndp.audit.bounds import fdp_mu_lower_bound
from keras_dyndp.audit.bounds import gdp_epsilon
from keras_dyndp.audit.bounds import one_run_epsilon_lower_bound
from keras_dyndp.audit.bounds import one_run_p_value
from keras_dyndp.audit.white_box import CanaryAuditReport
from keras_dyndp.audit.white_box import white_box_audit

__all__ = [
    "AuditResult",
    "CanaryAuditReport",
    "audit_from_scores",
    "black_box_audit",
    "fdp_epsilon_lower_bound",
    "fdp_mu_lower_bound",
    "gdp_epsilon",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "white_box_audit",
]
