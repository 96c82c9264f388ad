-- d3-fleet (d3_router role): the fleet endpoint's reading of a request body, as vLLM reads it.
-- vLLM parses the body as JSON (Python's json module through pydantic): a key given twice keeps its LAST value, and a
-- key may be spelled with escapes ("mod\u0065l" is "model"). HAProxy's json_query returns the first match of the
-- literal key only, so a body with two "model" keys was routed by the first and answered by vLLM for the last. This
-- action reads the top-level object's keys with escapes decoded and sets, for the configuration's rules:
--   txn.d3_model  the value of the one top-level "model" key, when it is a string
--   txn.d3_body   ok | not_json (not one JSON object) | duplicate_model | no_model | model_not_string
-- It checks only what routing needs (the object's structure and its keys); vLLM validates the rest of the JSON.
-- API: HAProxy's doc/lua-api/index.rst (core.register_action, TXN.f:req_body, TXN.set_var), the same in 2.6 and 3.0.

local ESCAPES = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

-- the string starting at s[i] == '"': its decoded text and the index after it; nil when it is not a JSON string
local function read_string(s, i)
    local parts, j = {}, i + 1
    while true do
        local k = s:find('["\\%c]', j)
        if not k then return nil end
        local c = s:sub(k, k)
        parts[#parts + 1] = s:sub(j, k - 1)
        if c == '"' then return table.concat(parts), k + 1 end
        if c ~= '\\' then return nil end -- a raw control character
        local e = s:sub(k + 1, k + 1)
        if ESCAPES[e] then
            parts[#parts + 1] = ESCAPES[e]
            j = k + 2
        elseif e == 'u' and s:sub(k + 2, k + 5):match('^%x%x%x%x$') then
            parts[#parts + 1] = utf8.char(tonumber(s:sub(k + 2, k + 5), 16))
            j = k + 6
        else
            return nil
        end
    end
end

-- the index after the JSON value starting at s[i]; nil when there is none
local function skip_value(s, i)
    local c = s:sub(i, i)
    if c == '"' then
        local _, after = read_string(s, i)
        return after
    end
    if c == '{' or c == '[' then
        local depth, j = 0, i
        while true do
            local k = s:find('[{}%[%]"]', j)
            if not k then return nil end
            local d = s:sub(k, k)
            if d == '"' then
                local _, after = read_string(s, k)
                if not after then return nil end
                j = after
            else
                depth = depth + ((d == '{' or d == '[') and 1 or -1)
                if depth == 0 then return k + 1 end
                j = k + 1
            end
        end
    end
    local k = s:find('[,}%]%s]', i) or #s + 1 -- a number, true, false or null
    if k == i or not s:sub(i, k - 1):match('^[%w%.%+%-]+$') then return nil end
    return k
end

local function ws(s, i)
    return s:find('[^ \t\r\n]', i) or #s + 1
end

-- (verdict, model) for a request body
local function read_model(s)
    local i = ws(s, 1)
    if s:sub(i, i) ~= '{' then return 'not_json' end
    local count, model, is_string = 0, nil, false
    i = ws(s, i + 1)
    if s:sub(i, i) == '}' then
        i = i + 1
    else
        while true do
            if s:sub(i, i) ~= '"' then return 'not_json' end
            local key, after = read_string(s, i)
            if not key then return 'not_json' end
            i = ws(s, after)
            if s:sub(i, i) ~= ':' then return 'not_json' end
            i = ws(s, i + 1)
            local value_end = skip_value(s, i)
            if not value_end then return 'not_json' end
            if key == 'model' then
                count = count + 1
                is_string = s:sub(i, i) == '"'
                model = is_string and read_string(s, i) or nil
            end
            i = ws(s, value_end)
            local c = s:sub(i, i)
            if c == '}' then
                i = i + 1
                break
            end
            if c ~= ',' then return 'not_json' end
            i = ws(s, i + 1)
        end
    end
    if ws(s, i) <= #s then return 'not_json' end
    if count == 0 then return 'no_model' end
    if count > 1 then return 'duplicate_model' end
    if not is_string then return 'model_not_string' end
    return 'ok', model
end

core.register_action('d3_read_model', { 'http-req' }, function(txn)
    local verdict, model = read_model(txn.f:req_body() or '')
    txn:set_var('txn.d3_body', verdict)
    if model then txn:set_var('txn.d3_model', model) end
end, 0)
