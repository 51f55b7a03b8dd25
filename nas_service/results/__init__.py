"""What a job's trials answer: the decoded trial rows and their cache, the Pareto front, the
d_model/L optimum and the scaling fits, the paired comparison, profiles, calibration of the
roofline, the landscape export, and the read schemas the API returns."""
