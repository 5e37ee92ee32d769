"""The storage conformance suite: every Dialect operation, on both databases.

One module a store of a dialect: test_enqueue.py, test_hot.py,
test_control.py, test_upkeep.py, test_schedules.py, test_partitions.py,
test_log.py, test_reads.py, test_limits.py and test_cluster.py;
test_descendants.py for the walks of a job's descendants the stores share
(db/descendants.py), and test_dialect.py for the dialect's own operations
(the whole database, its clock). test_contract.py holds the contract itself (COVERED: the
operations of each store) and the rules every store keeps; helpers.py and
conftest.py hold what the modules share.
"""
