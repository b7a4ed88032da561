package fleetpace

// SchemaLockKey is schemaLockKey, for the tests.
const SchemaLockKey = schemaLockKey
