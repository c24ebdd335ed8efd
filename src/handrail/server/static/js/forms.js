// Forms made from JSON Schema: a labelled input for each value a card asks for (an amendable
// argument, a person's answer), each with a `read()` that parses it or says it is invalid.
import { el } from "./dom.js";

export const INVALID = Symbol("invalid");

export function deref(schema, root) {
  let s = schema || {};
  for (let i = 0; i < 10 && s.$ref; i++) {
    const name = s.$ref.split("/").pop();
    s = { ...((root.$defs || root.definitions || {})[name] || {}), ...Object.fromEntries(Object.entries(s).filter(([k]) => k !== "$ref")) };
  }
  const options = s.anyOf || s.oneOf;
  if (options) {
    const real = options.filter((o) => o.type !== "null");
    if (real.length === 1) return { ...deref(real[0], root), ...Object.fromEntries(Object.entries(s).filter(([k]) => k !== "anyOf" && k !== "oneOf")), nullable: true };
  }
  return s;
}

export function propertySchema(schema, name) {
  return deref((schema.properties || {})[name] || {}, schema);
}

/** A labelled input for one value of `schema`; `read()` parses it (INVALID if it is not). */
export function schemaField(id, name, schema, value) {
  const plain = (t) => String(t).toLowerCase().replace(/[\s_-]+/g, "");
  const label = schema.title && plain(schema.title) !== plain(name) ? `${name} (${schema.title})` : name;
  const help = schema.description ? el("span", { class: "help", id: `${id}-help`, text: schema.description }) : null;
  const described = help ? `${id}-help` : undefined;
  let input;
  let read;
  if (Array.isArray(schema.enum)) {
    input = el("select", { id, name, "aria-describedby": described });
    if (schema.nullable || value === undefined) input.append(el("option", { value: "", text: "—" }));
    schema.enum.forEach((option, i) => input.append(el("option", { value: String(i), text: String(option) })));
    const at = schema.enum.findIndex((o) => JSON.stringify(o) === JSON.stringify(value));
    input.value = at >= 0 ? String(at) : "";
    read = () => (input.value === "" ? (schema.nullable ? null : undefined) : schema.enum[Number(input.value)]);
  } else if (schema.type === "boolean") {
    input = el("input", { id, name, type: "checkbox", "aria-describedby": described });
    input.checked = Boolean(value);
    read = () => input.checked;
  } else if (schema.type === "number" || schema.type === "integer") {
    input = el("input", {
      id,
      name,
      type: "number",
      inputmode: schema.type === "integer" ? "numeric" : "decimal",
      step: schema.type === "integer" ? "1" : "any",
      min: schema.minimum ?? schema.exclusiveMinimum,
      max: schema.maximum ?? schema.exclusiveMaximum,
      "aria-describedby": described,
    });
    if (value !== undefined && value !== null) input.value = String(value);
    read = () => {
      if (input.validity.badInput) return INVALID; // typed, but not a number
      if (input.value.trim() === "") return schema.nullable ? null : undefined;
      if (!input.checkValidity()) return INVALID;
      const number = Number(input.value);
      if (!Number.isFinite(number) || (schema.type === "integer" && !Number.isInteger(number))) return INVALID;
      if (schema.exclusiveMinimum !== undefined && number <= schema.exclusiveMinimum) return INVALID;
      if (schema.exclusiveMaximum !== undefined && number >= schema.exclusiveMaximum) return INVALID;
      return number;
    };
  } else if (schema.type === "string" || schema.type === undefined && !schema.properties) {
    const long = (schema.maxLength || 0) > 200 || schema.format === "textarea";
    input = el(long ? "textarea" : "input", {
      id,
      name,
      type: long ? undefined : schema.format === "date" ? "date" : schema.format === "email" ? "email" : "text",
      minlength: schema.minLength,
      maxlength: schema.maxLength,
      pattern: schema.pattern,
      autocomplete: "off",
      "aria-describedby": described,
    });
    if (value !== undefined && value !== null) input.value = String(value);
    read = () => {
      if (!input.checkValidity()) return INVALID;
      return input.value === "" && schema.nullable ? null : input.value;
    };
  } else {
    input = el("textarea", { id, name, rows: 3, "aria-describedby": described, class: "json" });
    if (value !== undefined) input.value = JSON.stringify(value, null, 2);
    read = () => {
      input.setCustomValidity("");
      try {
        return input.value.trim() ? JSON.parse(input.value) : undefined;
      } catch {
        input.setCustomValidity("not valid JSON");
        return INVALID;
      }
    };
  }
  const wrap = schema.type === "boolean" ? "field check" : "field";
  const node = el("div", { class: wrap }, el("label", { for: id, text: label }), input, help);
  return { node, input, read, name, label };
}

