// The study page. Everything shown is set with textContent: chat text is never parsed as HTML.
"use strict";

const PARTICIPANT_KEY = "simpop-study-participant-key";
const PARAMS = "simpop-study-params";
const state = { token: null, chat: null, maxChars: 1000, info: null, params: {} };
const $ = (id) => document.getElementById(id);

function notice(text) {
  const box = $("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: body ? { "Content-Type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  let data = {};
  try { data = await response.json(); } catch (e) { data = {}; }
  if (!response.ok) {
    const detail = typeof data.detail === "string" ? data.detail
      : Array.isArray(data.detail) ? data.detail.map((d) => d.msg).join("; ") : response.statusText;
    const error = new Error(detail);
    error.status = response.status;
    throw error;
  }
  return data;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function paragraphs(id, text) {  // blank lines part paragraphs; single line breaks are spaces
  $(id).replaceChildren(...text.split(/\n\s*\n/).map((p) => element("p", null, p.replace(/\s*\n\s*/g, " "))));
}

function show(id) {  // one page at a time: consent, questionnaire, the chats, debrief
  for (const page of ["consent", "questionnaire", "study", "debrief"]) $(page).hidden = page !== id;
}

function render(view) {
  show("study");
  state.chat = view.chat;
  state.maxChars = view.max_message_chars || state.maxChars;
  $("instructions").textContent = view.instructions;
  const list = $("messages");
  list.replaceChildren(...view.messages.map((m) => {
    const item = element("li", m.from);
    item.append(element("span", "who", m.from === "you" ? "You" : m.from === "tool" ? "Tool" : "Chat partner"));
    item.append(document.createTextNode(m.text));
    return item;
  }));
  list.scrollTop = list.scrollHeight;
  const yourTurn = view.turn === "you";
  const survey = yourTurn && view.survey;
  $("composer").hidden = view.turn === "done" || Boolean(survey);
  $("text").disabled = !yourTurn;
  $("send").disabled = !yourTurn;
  $("text").maxLength = state.maxChars;
  $("survey").hidden = !survey;
  if (survey) {
    $("survey-question").textContent = view.survey.question;
    $("survey-options").replaceChildren(...view.survey.options.map((option) => {
      const button = element("button", "option", option);
      button.type = "button";
      button.addEventListener("click", () => send(option));
      return button;
    }));
  }
  $("status").textContent = view.turn === "agent" ? "Your chat partner is typing…"
    : view.turn === "done" ? (view.abandoned ? "This chat timed out." : "The chat is over.")
    : view.error ? "Your last message was not accepted: " + view.error : "";
  $("rating").hidden = !(view.turn === "done" && !view.rated && !view.abandoned);
  $("progress").textContent = "Chat " + (view.number + 1) + (state.chats ? " of " + state.chats : "");
  if (view.turn === "agent") setTimeout(poll, 0);
  if (view.turn === "done" && view.abandoned) $("next").hidden = false;
}

async function poll() {
  try { render(await api("GET", "/api/chat/" + encodeURIComponent(state.chat) + "?wait=1")); }
  catch (error) { notice(error.message); }
}

async function join(consent) {
  notice("");
  $("next").hidden = true;
  try {
    const view = await api("POST", "/api/join", {
      token: state.token, key: localStorage.getItem(PARTICIPANT_KEY) || null, consent: Boolean(consent),
      params: state.params,
    });
    localStorage.setItem(PARTICIPANT_KEY, view.key);
    state.chats = view.chats;
    if (view.stage === "questionnaire") show("questionnaire");
    else render(view);
  } catch (error) {
    if (error.status === 428) { show("consent"); return; }
    if (error.status === 410) { finish(); return; }
    if (error.status === 403 || error.status === 400 || error.status === 409) show(null);
    notice(error.message);
  }
}

async function decline() {
  try { await api("POST", "/api/decline", { token: state.token }); } catch (error) { /* counted or not: leave */ }
  show(null);
  notice("You chose not to take part. Nothing about you was kept. You can close this page.");
}

async function answer(event) {
  event.preventDefault();
  const answers = {};
  for (const item of state.info.questionnaire) {
    const value = $("q-" + item.name).value;
    answers[item.name] = value === "" ? null : item.options.length ? value : Number(value);
  }
  try {
    await api("POST", "/api/questionnaire", { key: localStorage.getItem(PARTICIPANT_KEY), answers });
    join(false);
  } catch (error) { notice(error.message); }
}

async function finish() {
  try {
    const end = await api("POST", "/api/finish", { key: localStorage.getItem(PARTICIPANT_KEY) });
    show("debrief");
    notice("");
    paragraphs("debrief-text", end.debrief);
    $("code").textContent = end.code;
    if (end.redirect) { $("redirect").href = end.redirect; $("redirect").hidden = false; }
  } catch (error) { notice(error.message); }
}

function questions(items) {
  $("questions").replaceChildren(...items.map((item) => {
    const label = element("label", "item", item.question);
    let input;
    if (item.options.length) {
      input = element("select");
      input.append(element("option", null, ""), ...item.options.map((o) => {
        const option = element("option", null, o);
        option.value = o;
        return option;
      }));
    } else {
      input = element("input");
      input.type = "number";
      input.min = "18";
      input.max = "75";
    }
    input.id = "q-" + item.name;
    label.append(input);
    return label;
  }));
}

async function send(text) {
  if (!text.trim()) return;
  $("send").disabled = true;
  $("text").disabled = true;
  try {
    const view = await api("POST", "/api/chat/" + encodeURIComponent(state.chat) + "/message", { text });
    $("text").value = "";
    updateCount();
    notice("");
    render(view);
  } catch (error) {
    notice(error.message);
    $("send").disabled = false;
    $("text").disabled = false;
  }
}

async function rate(event) {
  event.preventDefault();
  const natural = document.querySelector("input[name=naturalness]:checked");
  const again = document.querySelector("input[name=again]:checked");
  const attention = document.querySelector("input[name=attention]:checked");
  if (!natural || !again || (state.info.attention && !attention)) { notice("Please answer every question."); return; }
  const ratings = { naturalness: Number(natural.value), would_talk_again: again.value === "yes" };
  if (state.info.attention) ratings.attention = Number(attention.value);
  try {
    const result = await api("POST", "/api/chat/" + encodeURIComponent(state.chat) + "/rating", ratings);
    $("rating").hidden = true;
    $("rating").reset();
    notice("");
    if (result.remaining > 0) { $("next").hidden = false; $("status").textContent = "Thank you!"; }
    else finish();
  } catch (error) { notice(error.message); }
}

function choices(fieldsetId, name, values, labels) {
  const fieldset = $(fieldsetId);
  values.forEach((value, i) => {
    const label = element("label");
    const input = element("input");
    input.type = "radio";
    input.name = name;
    input.value = value;
    label.append(input, document.createTextNode(" " + labels[i]));
    fieldset.append(label);
  });
}

function updateCount() {
  $("count").textContent = $("text").value.length + " / " + state.maxChars;
}

async function start() {
  const params = new URLSearchParams(location.search);
  state.token = params.get("token") || sessionStorage.getItem("simpop-study-token");
  state.params = JSON.parse(sessionStorage.getItem(PARAMS) || "{}");
  if (params.has("token")) {  // keep the token (and the platform's ids) out of the address bar and history
    params.delete("token");
    state.params = Object.fromEntries([...params.entries()].slice(0, 20));
    sessionStorage.setItem("simpop-study-token", state.token);
    sessionStorage.setItem(PARAMS, JSON.stringify(state.params));
    history.replaceState(null, "", location.pathname);
  }
  choices("naturalness", "naturalness", ["1", "2", "3", "4", "5"], ["1", "2", "3", "4", "5"]);
  choices("again", "again", ["yes", "no"], ["Yes", "No"]);
  choices("attention", "attention", ["1", "2", "3", "4", "5"], ["1", "2", "3", "4", "5"]);
  $("agree").addEventListener("click", () => join(true));
  $("decline").addEventListener("click", decline);
  $("questionnaire").addEventListener("submit", answer);
  $("composer").addEventListener("submit", (event) => { event.preventDefault(); send($("text").value); });
  $("text").addEventListener("input", updateCount);
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send($("text").value); }
  });
  $("rating").addEventListener("submit", rate);
  $("next-chat").addEventListener("click", () => join(false));
  if (!state.token) { notice("This page needs the study link with its token (…/?token=…)."); return; }
  try { state.info = await api("POST", "/api/study", { token: state.token }); }
  catch (error) { notice(error.message); return; }
  paragraphs("consent-text", state.info.consent);
  questions(state.info.questionnaire);
  $("shown").hidden = !state.info.questionnaire_to_policy;
  $("attention").hidden = !state.info.attention;
  $("attention-question").textContent = state.info.attention || "";
  if (state.info.mode === "self") {
    $("card-title").textContent = "Your task";
    $("card-hint").textContent = "Read this first, then chat as yourself.";
  }
  join(false);  // a returning participant goes on; a new one sees the consent page (428)
}

document.addEventListener("DOMContentLoaded", start);
