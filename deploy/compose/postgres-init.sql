-- Databases beside Dagster's (POSTGRES_DB): MLflow's tracking store and the feedback store. Runs once, on an empty
-- data volume.
CREATE DATABASE mlflow OWNER rag;
CREATE DATABASE feedback OWNER rag;
