-- The reconcile pass counts each deployment's tasks by state every second.
CREATE INDEX tasks_deployment_state ON tasks (deployment_id, state);
