-- Harness MCP tools a role may call without a permission prompt (headless runs deny anything else).
UPDATE role_profiles
SET allowed_tools = allowed_tools || '{mcp__harness__ask_user_question,mcp__harness__get_handoffs,mcp__harness__get_project_state,mcp__harness__check_ruled_out}'
WHERE role = 'worker';
UPDATE role_profiles
SET allowed_tools = '{mcp__harness__ask_user_question,mcp__harness__get_handoffs,mcp__harness__get_project_state,mcp__harness__check_ruled_out,mcp__harness__dispatch_worker}'
WHERE role = 'orchestrator';
