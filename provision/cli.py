"""The command line: every task collection in one namespace (root tasks.py hands it to Invoke)."""
from invoke import Collection

from provision import cluster_tasks, tasks, verify_tasks

ns = Collection(tasks.facts_, tasks.check, tasks.plan_, tasks.provision_, tasks.venv_, tasks.weights_,
                cluster_tasks.deploy, cluster_tasks.status_, cluster_tasks.bench, cluster_tasks.logs,
                tasks.rollback_, tasks.show_inventory, tasks.lab_tasks, verify_tasks.verify)
