"""The two Waltz node processes: the storage node (:mod:`waltz.services.storage`) and the server
(:mod:`waltz.services.server`, with its cluster manager), and what both runtimes share.
"""
