"""A bilingual concept lexicon: many ways of saying one thing, folded into one feature.

Requests say "sum up", "gist", "省流", "长话短说"; descriptors say "summarize".
Each concept lists its surface forms in English and Chinese, formal and
colloquial; a text containing any of them gets the feature ``k:<concept>``,
on the capability side (from names, keywords and descriptions) and on the
request side alike. It is query expansion, the oldest trick of lexical
retrieval: it lets two texts meet even when no word is shared.

The concepts are the everyday vocabulary of enterprise agents (documents,
languages, orders, shipping, money, people, code, time), not the words of
any one catalogue. English forms match whole stemmed words; Chinese forms
match as substrings.
"""

from __future__ import annotations

CONCEPTS: dict[str, tuple[str, ...]] = {
    "summarize": (
        "summarize", "summarise", "summary", "sum up", "gist", "tl;dr", "tldr", "recap",
        "condense", "key points", "main points", "bullet points", "bullets", "highlights",
        "digest", "overview", "brief", "总结", "概括", "摘要", "要点", "提炼", "精简", "简述",
        "长话短说", "省流", "归纳", "梳理", "几句话", "太长", "讲了啥", "讲了什么", "说了啥",
        "说了什么", "what does it say", "what is it about", "what's it about",
    ),
    "translate": (
        "translate", "translation", "translator",
        "翻译", "翻成", "译成", "译为", "翻一下", "怎么说", "译文", "英译中", "中译英",
    ),
    # Its own sense, not translation's (the issue: "localize" counted as translation).
    "localize": (
        "localize", "localise", "localization", "localisation", "l10n", "本地化",
    ),
    "rewrite": (
        "rewrite", "rephrase", "paraphrase", "polish", "reword", "tone", "formal", "casual",
        "sound more", "make it sound", "make this sound", "friendlier", "chill", "less stiff",
        "润色", "改写", "换个说法", "措辞", "语气", "正式", "口语化", "通顺", "委婉",
    ),
    "proofread": (
        "grammar", "spelling", "typo", "typos", "proofread", "punctuation", "spell check",
        "语法", "错别字", "拼写", "病句", "校对", "标点",
    ),
    "write_copy": (
        "copywriting", "ad copy", "slogan", "tagline", "caption", "post", "posts",
        "marketing", "xiaohongshu", "rednote", "文案", "广告语", "标语", "小红书", "种草",
        "推文", "卖点", "营销",
    ),
    "email": (
        "email", "e-mail", "mail", "inbox", "reply to", "邮件", "写信", "回信", "发给",
    ),
    "send": (
        "send", "sends", "forward", "cc", "bcc", "mail it", "email it", "email them",
        "deliver", "发送", "发出", "发给", "发过去", "发邮件", "转发", "抄送", "寄给",
    ),
    "meeting_notes": (
        "minutes", "meeting notes", "action items", "takeaways", "会议纪要", "会议记录", "纪要",
        "待办", "行动项",
    ),
    "schedule": (
        "schedule", "set up", "book a room", "calendar", "invite", "appointment",
        "free slot", "reschedule", "约一下", "约个", "约下", "拉个会", "排期",
        "日程", "会议室", "有空", "空闲", "安排会议", "订会议室", "跟进会",
    ),
    "entities": (
        "named entities", "entities", "entity", "people", "person names", "places",
        "locations", "organizations", "organisations", "companies mentioned", "mentioned in",
        "人名", "地名", "机构", "组织", "公司名", "实体", "提到的",
    ),
    "keywords": (
        "keywords", "keyword", "tags", "hashtags", "topics", "关键词", "关键字", "标签",
        "主题词",
    ),
    "sentiment": (
        "sentiment", "emotion", "mood", "angry", "upset", "happy", "satisfied", "unhappy",
        "positive", "negative", "feel", "feeling", "情感", "情绪", "生气", "满意", "不满",
        "好评", "差评", "正面", "负面", "口碑",
    ),
    "redact": (
        "redact", "anonymize", "anonymise", "mask", "pii", "personal data", "sensitive",
        "脱敏", "打码", "隐私", "敏感", "遮盖",
    ),
    "ticket": (
        "ticket", "tickets", "support ticket", "support queue", "complaint", "complaints",
        "工单", "客诉", "投诉",
    ),
    "classify": (
        "classify", "categorize", "categorise", "triage", "sort", "label", "bucket", "route",
        "分类", "分下类", "分好类", "分一下类", "归类", "分拣", "分派", "打标签",
    ),
    "faq": (
        "policy", "faq", "hours", "opening hours", "customer service", "do you", "do you offer",
        "can i", "how do i", "your store", "your shop", "your website", "政策", "规则",
        "常见问题", "客服", "营业时间", "客服时间", "支持吗", "你们支持", "你们可以", "你们有没有",
        "无理由", "怎么开", "能不能", "可以吗",
    ),
    "knowledge_base": (
        "knowledge base", "wiki", "confluence", "internal docs", "documentation", "handbook",
        "sop", "where can i find", "link to", "知识库", "内部文档", "文档", "文件", "制度", "手册",
        "规范", "在哪", "链接",
    ),
    "track_parcel": (
        "track", "tracking", "where is my package", "where's my package", "parcel", "courier",
        "delivery status", "快递", "包裹", "物流", "单号", "运单", "到哪", "派送", "签收",
        "还没到", "卡在", "到了没", "顺丰", "中通", "圆通", "韵达", "申通", "京东物流", "ems",
    ),
    "order": (
        "order", "orders", "my order", "purchase", "订单", "下单", "下的单", "买的",
    ),
    "refund": (
        "refund", "return", "money back", "chargeback", "退款", "退货", "退钱", "售后", "换货",
    ),
    "shipping_cost": (
        "shipping cost", "postage", "freight", "cost to ship", "ship", "shipping", "运费",
        "邮费", "寄", "寄件", "时效", "几天能到", "多久能到",
    ),
    "price": (
        "price", "cost", "how much", "quote", "fee", "多少钱", "价格", "费用", "报价", "价钱",
    ),
    "recommend": (
        "recommend", "recommendation", "suggest", "what should i buy", "which one", "best",
        "gift", "推荐", "挑", "选购", "买什么", "送礼", "性价比", "种草",
    ),
    "inventory": (
        "in stock", "out of stock", "inventory", "availability", "restock", "warehouse",
        "库存", "有货", "缺货", "现货", "补货", "仓库",
    ),
    "invoice": (
        "invoice", "receipt", "vat", "fapiao", "billing", "发票", "收据", "税额", "增值税",
    ),
    "expense": (
        "expense", "expenses", "reimburse", "reimbursement", "claim", "报销", "垫付", "差旅费",
    ),
    "currency": (
        "currency", "exchange rate", "fx", "usd", "eur", "jpy", "rmb", "cny", "dollars",
        "yen", "euro", "汇率", "换算", "兑换", "人民币", "美元", "日元", "欧元", "港币",
    ),
    "stock_market": (
        "stock price", "share price", "shares", "ticker", "nasdaq", "nyse", "market cap",
        "股价", "股票", "行情", "涨跌", "市值", "大盘", "港股", "美股", "a股",
    ),
    "contract": (
        "contract", "agreement", "nda", "clause", "clauses", "legal", "terms", "合同", "协议",
        "条款", "法务", "坑",
    ),
    "leave": (
        "leave", "day off", "days off", "time off", "pto", "vacation", "sick", "请假", "年假",
        "病假", "事假", "调休", "休假",
    ),
    "code_review": (
        "code review", "review my code", "review this code", "pull request", "pr", "diff",
        "cr", "bug", "bugs", "race condition", "代码审查", "代码评审", "看代码", "找bug",
        "看看代码", "并发问题",
    ),
    "write_code": (
        "write code", "script", "function", "implement", "program", "snippet", "unit test",
        "python", "javascript", "写代码", "脚本", "函数", "实现", "写个",
    ),
    "sql": (
        "sql", "postgresql", "postgres", "mysql", "sqlite", "database", "select", "join",
        "table", "tables", "query that", "数据库", "sql语句", "查询语句", "取数", "建表",
        "表里", "字段",
    ),
    "image_text": (
        "ocr", "photo", "picture", "image", "screenshot", "scan", "scanned", "whiteboard",
        "text out of", "text from", "图片", "照片", "截图", "扫描", "拍照", "拍的", "手写",
    ),
    "speech": (
        "transcribe", "transcription", "speech to text", "audio", "voice", "recording",
        "podcast", "语音", "录音", "转写", "听写", "字幕", "转文字",
    ),
    "weather": (
        "weather", "forecast", "rain", "raining", "snow", "sunny", "temperature", "umbrella",
        "aqi", "air quality", "humid", "windy", "天气", "下雨", "下雪", "气温", "温度", "预报",
        "带伞", "空气质量", "雾霾", "台风", "冷不冷", "热不热", "降温",
    ),
    "web_search": (
        "search", "google", "bing", "baidu", "look up", "online", "on the web", "website",
        "搜", "搜一下", "搜索", "百度", "上网查", "网上",
    ),
    "make_image": (
        "draw", "drawing", "illustration", "generate an image", "generate a picture",
        "poster", "logo", "render", "画", "画图", "画一张", "生成图片", "海报", "插画", "配图",
    ),
    "chart": (
        "chart", "graph", "plot", "visualize", "visualise", "dashboard", "bar chart",
        "line chart", "pie chart", "图表", "可视化", "柱状图", "折线图", "饼图", "画个图",
    ),
    "remind": (
        "remind", "reminder", "reminders", "nudge me", "ping me", "don't let me forget",
        "alert me", "提醒", "提个醒", "别忘了", "别让我忘", "闹钟",
    ),
    "report": (
        "report", "reports", "weekly report", "monthly report", "kpi", "kpis",
        "报告", "报表", "周报", "月报", "季报", "年报", "经营分析",
    ),
    "slides": (
        "slides", "slide deck", "deck", "presentation", "powerpoint", "ppt", "keynote",
        "幻灯片", "演示文稿", "演示", "汇报材料",
    ),
    "recruiting": (
        "resume", "resumes", "résumé", "cv", "cvs", "candidate", "candidates", "applicant",
        "applicants", "shortlist", "hiring", "job description", "简历", "候选人", "应聘",
        "招聘", "求职", "筛简历",
    ),
    "password": (
        "password", "passcode", "locked out", "reset my login", "can't log in",
        "cannot log in", "密码", "登不上", "登录不了", "账号被锁", "解锁账号",
    ),
    "it_support": (
        "laptop", "printer", "wifi", "wi-fi", "vpn", "crash", "crashes", "won't start",
        "not working", "helpdesk", "help desk", "it support", "电脑", "打印机",
        "网络", "蓝屏", "死机", "打不开", "报修", "工单",
    ),
    "payroll": (
        "payslip", "pay slip", "salary slip", "payroll", "salary", "wage", "wages",
        "pay stub", "paycheck", "工资", "工资条", "薪资", "薪水", "个税", "社保", "公积金",
    ),
    "survey": (
        "survey", "questionnaire", "poll", "feedback form", "问卷", "调查", "调研",
        "满意度", "投票", "表单",
    ),
    "travel": (
        "flight", "flights", "hotel", "train ticket", "business trip", "itinerary", "book a trip",
        "机票", "酒店", "火车票", "高铁", "出差", "行程", "航班",
    ),
    "read_aloud": (
        "text to speech", "text-to-speech", "tts", "read aloud", "read it out", "voiceover",
        "voice-over", "narrate", "narration", "朗读", "配音", "念出来", "读出来", "语音播报",
        "合成语音",
    ),
    "spreadsheet": (
        "spreadsheet", "excel", "csv", "duplicates", "dedupe", "deduplicate", "columns",
        "cells", "表格", "去重", "单元格", "拆分列", "合并列", "清洗",
    ),
    "calculate": (
        "calculate", "calculation", "compute", "interest rate", "compound interest",
        "percentage", "how many days", "计算", "算一下", "算算", "利息", "换算", "百分比",
        "折合",
    ),
    "compliance": (
        "legal advice", "lawful", "illegal", "compliance", "labour law", "labor law",
        "regulation", "regulations", "合规", "违法", "合法", "法规", "劳动法", "法律",
    ),
    "news": (
        "news", "headlines", "briefing", "latest", "today's", "新闻", "资讯", "早报", "快讯",
        "热点", "动态", "简报",
    ),
}
