-- When each API token was last used: written by the API processes at most once a minute per
-- token (api/token_use.py), so an admin can tell a token in use from one to revoke. NULL: not
-- used since this column exists.
ALTER TABLE tickler_token ADD COLUMN last_used_on timestamp with time zone;

-- The key of the request that issued a token, when it sent one (the dashboard's form does): the
-- same form sent again (a reload of the page that showed the new token) finds the token it made
-- instead of making a second one.
ALTER TABLE tickler_token ADD COLUMN issue_key text;
CREATE UNIQUE INDEX tickler_token_issue_key ON tickler_token USING btree (issue_key) WHERE (issue_key IS NOT NULL);
