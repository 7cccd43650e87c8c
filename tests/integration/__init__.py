"""Against real consumers: the APM test agent, libdatadog, the AgentWriter."""
