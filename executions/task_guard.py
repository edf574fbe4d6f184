"""The guard that replaces the execution -> task foreign key on deletion: a task that still has
executions cannot be deleted (see ``Execution.task`` and migration 0016, which installs it).

The table names are the models' own.
"""

from __future__ import annotations

EXECUTION = "executions_execution"  # Execution._meta.db_table (migrations must not import models)
TASK = "tasks_app_task"
MESSAGE = "task still has executions"

INSTALL = f"""
CREATE FUNCTION tms_task_deleted_without_executions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {EXECUTION} WHERE task_id = OLD.id) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation', MESSAGE = '{MESSAGE}',
            DETAIL = format('Key (id)=(%s) is still referenced from table "{EXECUTION}".', OLD.id);
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER tms_task_deleted_without_executions AFTER DELETE ON {TASK}
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tms_task_deleted_without_executions();
"""  # noqa: S608 - our names
UNINSTALL = f"""
DROP TRIGGER IF EXISTS tms_task_deleted_without_executions ON {TASK};
DROP FUNCTION IF EXISTS tms_task_deleted_without_executions();
"""
