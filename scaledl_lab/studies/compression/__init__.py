"""The compression family's study (notebook 08): every compressor on one run and time per step by
network (:mod:`.study`), and its tables, verdicts, figures and summary (:mod:`.report`); the
technique itself is :mod:`scaledl_lab.strategies.compression`."""
