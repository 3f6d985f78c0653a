"""The replicated store: store sessions, replica sessions, recovery and quorum voting.

Source: seed 000 "Server-Storage Communications", "Recovery Procedure", "Quorum Checking";
seed 003 "Store Partition Object", "Recovery Procedure", "Quorum Checking in the Recovery
Process".
"""
