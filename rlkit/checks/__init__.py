"""Submit-time checks of a parsed config, each given the job type's record (never its name); torch-free."""
